// scaled_dot_product_attention picks its backend through _fused_sdp_choice_stub, a
// DispatchStub (not the dispatcher), so Python cannot register the tpu choice directly.
// The tpu entry here forwards to the aten::_fused_sdp_choice op's PrivateUse1 kernel,
// which torch_tpu.kernels registers in Python; without one, SDPA takes the math path.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>
#include <c10/core/DispatchKeySet.h>

#include <optional>

namespace torch_tpu {
namespace {

int64_t fused_sdp_choice_tpu(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                             const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                             std::optional<double> scale, bool enable_gqa) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_fused_sdp_choice", "");
  if (!op.hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
    return static_cast<int64_t>(sdp::SDPBackend::math);
  }
  return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), query, key,
                                                 value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace torch_tpu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_tpu::fused_sdp_choice_tpu)
}  // namespace at::native
