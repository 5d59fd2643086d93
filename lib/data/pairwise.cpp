// Pairwise JSONL lines read through LLaMA-Factory's record shapes (data/llamafactory.h's
// plain entry), and the two sides of a pair rendered with only the final answer trained.
#include "data/pairwise.h"

#include "core/check.h"
#include "core/input_file.h"
#include "data/jsonl_lines.h"
#include "data/llamafactory.h"

#include <algorithm>

namespace dtrain::data {

PairRecord pair_parse_line(std::string_view line, const std::string& file, size_t line_no) {
  LlamaFactoryEntry plain;
  plain.file = file;
  plain.plain = true;
  plain.ranking = true;
  return llamafactory_pair_record(plain, line, line_no, 0);
}

std::vector<PairRecord> pair_load_jsonl(const std::string& path) {
  const std::string text = input_file_read(path, "pairwise data", kInputAnySize);
  std::vector<PairRecord> records;
  jsonl_lines(text,
              [&](std::string_view line, size_t line_no) { records.push_back(pair_parse_line(line, path, line_no)); });
  return records;
}

namespace {

// The side's whole record rendered, its mask cut to the last trained run (the final
// answer: the templates mask each answer's content and end of turn as one run, with
// prompt tokens between answers). Returns the tokens before that run.
size_t final_answer_only(SftTokens& t, const std::string& source) {
  size_t end = t.mask.size();
  while (end > 0 && t.mask[end - 1] == 0) --end;
  DT_ENFORCE(end > 0, InternalError, "{}: the rendered answer has no trained token", source);
  size_t begin = end;
  while (begin > 0 && t.mask[begin - 1] != 0) --begin;
  std::fill(t.mask.begin(), t.mask.begin() + static_cast<std::ptrdiff_t>(begin), uint8_t{0});
  return begin;
}

}  // namespace

PairTokens pair_render(const PairRecord& record, const Tokenizer& tokenizer, const SftTemplate& tmpl, bool add_bos,
                       bool train_on_prompt) {
  PairTokens out;
  out.chosen = sft_render(record.side(true), tokenizer, tmpl, add_bos, false);
  out.rejected = sft_render(record.side(false), tokenizer, tmpl, add_bos, false);
  out.chosen_prompt = final_answer_only(out.chosen, record.source);
  out.rejected_prompt = final_answer_only(out.rejected, record.source);
  if (train_on_prompt) {
    std::fill(out.chosen.mask.begin(), out.chosen.mask.end(), uint8_t{1});
    std::fill(out.rejected.mask.begin(), out.rejected.mask.end(), uint8_t{1});
  }
  return out;
}

}  // namespace dtrain::data
