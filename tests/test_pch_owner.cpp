// The target that builds the test suites' precompiled header (tests/test_pch.h) for every
// test binary to reuse (CMakeLists.txt, dtrain_test_pch). It holds no test cases and is
// never run.
