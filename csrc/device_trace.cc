// Device time for torch.profiler: a Kineto child profiler for the tpu (PrivateUse1) device.
//
// torch.profiler.profile(activities=[CPU, PrivateUse1]) configures this profiler. While it
// records, a RecordFunction callback ends every ATen op that touches a tpu tensor by waiting
// for the op's tpu outputs to be ready, so each op's device work is done when it returns. The
// op's device activity is its span from dispatch to that moment, less the spans of the tpu ops
// it called (they have their own), so activities never overlap and nothing counts twice. Each
// is linked to its op through Kineto's correlation id: key_averages() shows "Self TPU" and
// "TPU total" times, and the Chrome trace a tpu row. Waiting makes ops run one at a time while
// recording (as CUDA_LAUNCH_BLOCKING=1 does), and a dispatch's host work (and a first call's
// compile) is inside the span. XLA's own per-kernel timeline is torch_tpu.tools.profile's.
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <Python.h>
#include <c10/util/ApproximateClock.h>
#include <kineto/libkineto.h>
#include <kineto/output_base.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "csrc/device_buffer.h"

namespace torch_tpu {
namespace {

constexpr c10::DeviceType kTpu = c10::DeviceType::PrivateUse1;

// An op Kineto has opened on this thread: its correlation id, when it was dispatched, and the
// parts of its span not inside a tpu op it called: `gaps` so far, and from `resume_ns` on.
struct Frame {
  uint64_t id;
  int64_t start_ns;
  int64_t resume_ns;
  std::vector<std::pair<int64_t, int64_t>> gaps;
};
thread_local std::vector<Frame> t_frames;

// One timed tpu op.
struct OpSpan {
  uint64_t id;
  int device;
  std::string name;
  int64_t start_ns;
  int64_t end_ns;
};

std::mutex g_mutex;
std::vector<OpSpan> g_spans;
std::atomic<bool> g_recording{false};
std::optional<at::CallbackHandle> g_callback;

// The index of the first tpu device among the tensors in `values` (or keeps `device`), and
// the storages of those tensors into `storages` when it is not null.
void scan(c10::ArrayRef<c10::IValue> values, int& device, std::vector<c10::Storage>* storages) {
  auto visit = [&](const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kTpu || !t.has_storage()) {
      return;
    }
    if (device < 0) {
      device = t.device().index();
    }
    if (storages != nullptr) {
      storages->push_back(t.storage());
    }
  };
  for (const c10::IValue& value : values) {
    if (value.isTensor()) {
      visit(value.toTensor());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorVector()) {
        visit(t);
      }
    }
  }
}

// Waits until the jax arrays behind `storages` are ready. A storage without an array (never
// written, or holding a host-tier value) has no device work to wait for.
void wait_ready(const std::vector<c10::Storage>& storages) {
  if (storages.empty() || !Py_IsInitialized()) {
    return;
  }
  PyGILState_STATE state = PyGILState_Ensure();
  for (const c10::Storage& storage : storages) {
    try {
      DeviceBuffer& buffer = buffer_of(storage);
      if (!buffer.has_array()) {
        continue;
      }
      PyObject* array = buffer.array(false);
      if (array != nullptr && PyObject_HasAttrString(array, "block_until_ready")) {
        Py_XDECREF(PyObject_CallMethod(array, "block_until_ready", nullptr));
      }
      Py_XDECREF(array);
    } catch (const std::exception&) {  // a storage that is no tpu buffer: nothing to wait for
    }
    PyErr_Clear();  // the op's own error, if any, is raised where its value is read
  }
  PyGILState_Release(state);
}

// The tpu device among an op's inputs (they are only readable while the op starts).
struct InputDevice final : at::ObserverContext {
  int device = -1;
};

std::unique_ptr<at::ObserverContext> on_op_start(const at::RecordFunction& fn) {
  auto context = std::make_unique<InputDevice>();
  try {
    scan(fn.inputs(), context->device, nullptr);
  } catch (const std::exception&) {
  }
  return context;
}

// Runs before Kineto's own end callback, so t_frames.back() is still this op's frame.
void on_op_end(const at::RecordFunction& fn, at::ObserverContext* ctx) {
  if (!g_recording.load(std::memory_order_relaxed) || t_frames.empty()) {
    return;
  }
  try {
    int device = -1;
    std::vector<c10::Storage> outputs;
    scan(fn.outputs(), device, &outputs);
    if (device < 0 && ctx != nullptr) {
      device = static_cast<InputDevice*>(ctx)->device;
    }
    if (device < 0) {
      return;
    }
    wait_ready(outputs);
    const int64_t end_ns = c10::getTime();
    Frame& self = t_frames.back();
    self.gaps.emplace_back(self.resume_ns, end_ns);
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      for (const auto& [start, end] : self.gaps) {
        if (end > start) {
          g_spans.push_back({self.id, device, fn.name(), start, end});
        }
      }
    }
    if (t_frames.size() > 1) {  // the caller's own time stops here and resumes now
      Frame& caller = t_frames[t_frames.size() - 2];
      caller.gaps.emplace_back(caller.resume_ns, self.start_ns);
      caller.resume_ns = end_ns;
    }
  } catch (const std::exception&) {  // never fail the op for the profiler's sake
  }
}

class TpuTraceSession final : public libkineto::IActivityProfilerSession {
 public:
  explicit TpuTraceSession(bool active) : active_(active) {}

  /** Starts timing tpu ops (only when device activity was asked for). */
  void start() override {
    if (active_) {
      {
        std::lock_guard<std::mutex> lock(g_mutex);
        g_spans.clear();
      }
      g_callback = at::addGlobalCallback(at::RecordFunctionCallback(&on_op_start, &on_op_end)
                                             .needsInputs(true)
                                             .needsOutputs(true)
                                             .scopes({at::RecordScope::FUNCTION}));
      g_recording = true;
    }
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    if (active_) {
      g_recording = false;
      if (g_callback) {
        at::removeCallback(*g_callback);
        g_callback.reset();
      }
    }
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }

  /** Logs one device activity per timed op, linked to the op's CPU activity. */
  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t start_ns,
                    int64_t end_ns) override {
    std::vector<OpSpan> spans;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      spans.swap(g_spans);
    }
    span_ = std::make_unique<libkineto::TraceSpan>(start_ns, end_ns, "tpu");
    for (const OpSpan& op : spans) {
      // Its own name: key_averages() would merge an "aten::mm" device row into the op's row.
      libkineto::GenericTraceActivity activity(*span_, libkineto::ActivityType::CONCURRENT_KERNEL, op.name + " (tpu)");
      activity.startTime = op.start_ns;
      activity.endTime = op.end_ns;
      activity.id = static_cast<int32_t>(op.id);
      activity.device = op.device;
      activity.resource = 0;  // the device's one in-order stream
      activity.linked = linked ? linked(static_cast<int32_t>(op.id)) : nullptr;
      activity.addMetadataQuoted("device", "tpu:" + std::to_string(op.device));
      activity.addMetadataQuoted("measured", "dispatch to outputs ready");
      activity.log(logger);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(0, 0, "tpu", "tpu");
  }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

  /** Kineto opens an op (its correlation id): the op's frame on this thread. */
  void pushCorrelationId(uint64_t id) override {
    const int64_t now = c10::getTime();
    t_frames.push_back({id, now, now, {}});
  }
  void popCorrelationId() override {
    if (!t_frames.empty()) {
      t_frames.pop_back();
    }
  }

 private:
  bool active_;
  std::unique_ptr<libkineto::TraceSpan> span_;
};

class TpuActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& /*config*/) override {
    return std::make_unique<TpuTraceSession>(types.count(libkineto::ActivityType::CONCURRENT_KERNEL) > 0);
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"torch_tpu"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL};
};

// Kineto takes the factory now, or keeps it until it initializes.
const bool g_registered = [] {
  libkineto::api().registerProfilerFactory([] { return std::make_unique<TpuActivityProfiler>(); });
  return true;
}();

}  // namespace
}  // namespace torch_tpu
