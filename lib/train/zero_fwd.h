// Forward declarations of the ZeRO engine's parts and state, for the part headers that
// borrow each other by reference (zero_engine.h defines the options, zero_slot.h the
// slots and buckets, zero_layout.h the placement).
#pragma once

namespace dtrain::train {

struct ZeroOptions;
struct ZeroPlacement;
struct ZeroShard;
struct ZeroSlot;
struct ZeroBucket;
struct ZeroBufferView;
class ZeroCollectives;
class ZeroCommQueue;
class ZeroWorkMeter;
class ZeroCompression;
class ZeroOffload;
class ZeroGather;
class ZeroWeights;

}  // namespace dtrain::train
