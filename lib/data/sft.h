// Supervised fine-tuning: records (data/sft_record.h) rendered through a chat template
// (data/chat_template.h) into tokens plus a loss mask on the assistant turns, and the
// answer checker of evaluation.
#pragma once

#include "data/chat_template.h"
#include "data/sft_record.h"
#include "data/tokenizer.h"

#include <string>

namespace dtrain::data {

// ---------------------------------------------------------------------------
// Answer checking (the eval command). The generated text is cut at the first end
// marker (<|eos|>, <|endoftext|>, <|im_end|>, <|end_of_text|>, <|eot_id|>, </s>) and
// at "\n###" (a new plain-template section); then both sides are compared with runs of
// white space collapsed to one space and leading/trailing white space removed.
bool sft_answer_matches(const std::string& expected, const std::string& generated);

}  // namespace dtrain::data
