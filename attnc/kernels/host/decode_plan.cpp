// Owns: the plain C entry points of the host decode planner library (built by the JIT from
// this file: attnc/runtime/planning/decode_plan_library.py loads it with ctypes). Only pointers and
// integers cross; the structs are those of decode_plan_abi.h, the codes those of
// attnc/abi_codes.h. No exception leaves an entry (c_boundary.h: ATTNC_PLAN_NO_MEMORY when the
// planner's scratch cannot be allocated).
#include <stdint.h>

#include "c_boundary.h"
#include "decode_step.h"
#include "decode_step_cuda.h"

namespace {
// The scratch of the checks and steps of this thread (attnc_decode_check, attnc_decode_step
// and attnc_decode_step_checked).
attnc::decode_plan::Scratch& step_scratch() {
  static thread_local attnc::decode_plan::Scratch scratch;
  return scratch;
}
}  // namespace

extern "C" {

// Plan one step into params->buf (decode_plan.h: plan). An ATTNC_PLAN_* code.
ATTNC_PLAN_EXPORT int attnc_decode_plan(const AttncPlanParams* params, AttncPlanSummary* summary) {
  static thread_local attnc::decode_plan::Scratch scratch;
  return attnc::no_throw([&] { return attnc::decode_plan::plan(*params, summary, scratch); });
}

// sizeof of the four structs, checked against the ctypes mirrors at load time.
ATTNC_PLAN_EXPORT void attnc_decode_plan_sizes(int64_t* out) {
  out[0] = static_cast<int64_t>(sizeof(AttncPlanParams));
  out[1] = static_cast<int64_t>(sizeof(AttncPlanSummary));
  out[2] = static_cast<int64_t>(sizeof(AttncStepParams));
  out[3] = static_cast<int64_t>(sizeof(AttncStepResult));
}

// The page-table checks alone (decode_step.h: check_tables): the KV lengths and page
// begins land in params->kv_out and params->page_begin_out; params->tables_checked says
// whether they passed.
ATTNC_PLAN_EXPORT int attnc_decode_check(AttncStepParams* params, AttncStepResult* result) {
  return attnc::no_throw(
      [&] { return attnc::decode_plan::check_tables(*params, result, step_scratch()); });
}

// BatchDecodeWrapper.plan after its scalar checks (decode_step.h: step).
ATTNC_PLAN_EXPORT int attnc_decode_step(AttncStepParams* params, AttncStepResult* result) {
  return attnc::no_throw(
      [&] { return attnc::decode_plan::step(*params, result, step_scratch()); });
}

// The step of the tables attnc_decode_check has just passed, with that check's ``result``,
// without checking them again (decode_step.h: step_checked).
ATTNC_PLAN_EXPORT int attnc_decode_step_checked(AttncStepParams* params,
                                                AttncStepResult* result) {
  return attnc::no_throw(
      [&] { return attnc::decode_plan::step_checked(*params, result, step_scratch()); });
}

// The mask spans of ``batch`` KV lengths from the mask's range rows (decode_step.h:
// decode_spans): ATTNC_PLAN_OK, or ATTNC_PLAN_OUT_OF_RANGE for malformed rows.
ATTNC_PLAN_EXPORT int attnc_decode_spans(const AttncRangeRows* ranges, const int64_t* kv_lens,
                                         int64_t batch, int64_t q_len, int64_t kv_tile,
                                         int64_t* offset, int64_t* length) {
  static thread_local std::vector<int64_t> c;
  return attnc::no_throw([&] {
    return attnc::decode_plan::decode_spans(*ranges, kv_lens, batch, q_len, kv_tile, offset,
                                            length, c)
               ? ATTNC_PLAN_OK
               : ATTNC_PLAN_OUT_OF_RANGE;
  });
}

// Wait for the copies of the last step (a cudaError_t).
ATTNC_PLAN_EXPORT int attnc_decode_wait(AttncStepParams* params) {
  return static_cast<int>(attnc::decode_plan::cuda().wait(*params));
}

// Wait for and destroy the event of ``params`` (a cudaError_t).
ATTNC_PLAN_EXPORT int attnc_decode_release(AttncStepParams* params) {
  return static_cast<int>(attnc::decode_plan::cuda().release(*params));
}

ATTNC_PLAN_EXPORT const char* attnc_decode_cuda_error(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

// Test only: ``fake`` >= 0 switches host memcpys in for the CUDA calls (1) or back (0);
// out[0..3] = copies, event records, waits, event creations so far.
ATTNC_PLAN_EXPORT void attnc_decode_fake_cuda(int fake, int64_t* out) {
  attnc::decode_plan::Cuda& c = attnc::decode_plan::cuda();
  if (fake >= 0) c.fake = fake != 0;
  out[0] = c.copies;
  out[1] = c.records;
  out[2] = c.waits;
  out[3] = c.creates;
}

}  // extern "C"
