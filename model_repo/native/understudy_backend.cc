// Triton backend "understudy": serves a model (a generated variant, or an imported ONNX or
// TorchScript file) through the per-server runtime (model_repo/runtime.py) without a Python stub.
//
// Why: with Triton's Python backend every model instance starts a stub process that boots an
// interpreter and imports NumPy before our code runs: about 150 ms of CPU per load on the test
// machine, 85 % of a whole interim load. Triton's native framework backends (libtorch,
// TensorRT) pay nothing of the kind; neither does this one. A model instance is one Unix-socket
// connection to the runtime, which forks a worker that already holds torch:
//
//   initialize  -> {"op":"spawn","model":NAME,"model_dir":DIR,"config":MODEL_CONFIG}
//               <- {"ok":true,"report":{...},"output":NAME,"extras":"exit_index:INT32,..."}
//                  | {"ok":false,"error":"..."}
//   execute     -> {"op":"infer","shape":[N,C,H,W],"dtype":"float32"} + N*C*H*W floats
//               <- {"ok":true,"shape":[N,K],"dtype":"float32","extras":E} + N*K floats, then
//                  N 4-byte values per extra output | {"ok":false,...}
//   finalize    close the connection (the worker exits with it)
//
// Frames are the runtime's: "!II" (big-endian header and payload lengths), a JSON header, the
// raw payload. The socket path comes from UNDERSTUDY_RUNTIME_SOCKET in Triton's environment.
// A dynamic batch of requests becomes one forward pass; its logits are split back by request.
// A model has one FP32 input (whatever its name: the request's first) and one FP32 output,
// named as the worker's spawn reply says, then the extra outputs the reply announces (an
// early-exit model's exit index and each request's execution time: model_repo/early_exit.py),
// each one value (INT32 or FP32) per item, answered as N x 1 tensors.
// Every request and batch is reported to Triton's statistics, as Triton's own backends do, so
// the server's inference counters and durations (and its metrics endpoint) count them.

#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "triton_abi.h"

namespace {

constexpr const char* kDefaultOutputName = "logits";
constexpr const char* kSocketEnv = "UNDERSTUDY_RUNTIME_SOCKET";
constexpr uint32_t kMaxHeaderBytes = 1u << 20;

TRITONSERVER_Error* MakeError(TRITONSERVER_Error_Code code, const std::string& message) {
  return TRITONSERVER_ErrorNew(code, message.c_str());
}

void Log(TRITONSERVER_LogLevel level, int line, const std::string& message) {
  TRITONSERVER_Error* err = TRITONSERVER_LogMessage(level, __FILE__, line, message.c_str());
  if (err != nullptr) TRITONSERVER_ErrorDelete(err);
}

// A JSON string literal for `value` (names and paths: quotes, backslashes, control bytes).
std::string JsonString(const std::string& value) {
  std::string out = "\"";
  for (unsigned char c : value) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// The runtime writes compact JSON (separators "," and ":"), so a reply succeeded exactly when
// its header holds "ok":true. The error text, if any, is the string after "error":.
bool ReplyOk(const std::string& header) { return header.find("\"ok\":true") != std::string::npos; }

// The string value of `field` in a reply header ("" when absent).
std::string ReplyString(const std::string& header, const std::string& field) {
  const std::string key = "\"" + field + "\":\"";
  size_t at = header.find(key);
  if (at == std::string::npos) return "";
  std::string out;
  for (size_t i = at + key.size(); i < header.size(); ++i) {
    char c = header[i];
    if (c == '"') break;
    if (c == '\\' && i + 1 < header.size()) {
      char next = header[++i];
      out += next == 'n' ? '\n' : next == 't' ? '\t' : next;
    } else {
      out += c;
    }
  }
  return out;
}

std::string ReplyError(const std::string& header) {
  std::string error = ReplyString(header, "error");
  return error.empty() ? header : error;
}

// One blocking connection to the runtime, speaking its frames.
class RuntimeConnection {
 public:
  ~RuntimeConnection() { Close(); }

  TRITONSERVER_Error* Connect(const std::string& path) {
    sockaddr_un address{};
    if (path.size() >= sizeof(address.sun_path)) {
      return MakeError(TRITONSERVER_ERROR_INVALID_ARG, "runtime socket path too long: " + path);
    }
    Close();
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd_ < 0) return Errno("socket");
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      TRITONSERVER_Error* err = Errno("connect to the torch runtime at " + path);
      Close();
      return err;
    }
    return nullptr;
  }

  // Sends header + payload (payload given as up to several pieces, written in order).
  TRITONSERVER_Error* Send(const std::string& header,
                           const std::vector<std::pair<const void*, size_t>>& payload) {
    uint64_t payload_bytes = 0;
    for (const auto& piece : payload) payload_bytes += piece.second;
    if (payload_bytes > UINT32_MAX) {
      return MakeError(TRITONSERVER_ERROR_INVALID_ARG, "batch too large for one frame");
    }
    uint32_t lengths[2] = {htonl(static_cast<uint32_t>(header.size())),
                           htonl(static_cast<uint32_t>(payload_bytes))};
    TRITONSERVER_Error* err = WriteAll(lengths, sizeof(lengths));
    if (err == nullptr) err = WriteAll(header.data(), header.size());
    for (const auto& piece : payload) {
      if (err != nullptr) break;
      err = WriteAll(piece.first, piece.second);
    }
    return err;
  }

  TRITONSERVER_Error* Receive(std::string* header, std::vector<char>* payload) {
    uint32_t lengths[2];
    TRITONSERVER_Error* err = ReadAll(lengths, sizeof(lengths));
    if (err != nullptr) return err;
    uint32_t header_len = ntohl(lengths[0]);
    uint32_t payload_len = ntohl(lengths[1]);
    if (header_len > kMaxHeaderBytes) {
      return MakeError(TRITONSERVER_ERROR_INTERNAL, "runtime frame header too large");
    }
    header->assign(header_len, '\0');
    err = ReadAll(&(*header)[0], header_len);
    if (err != nullptr) return err;
    payload->resize(payload_len);
    return payload_len == 0 ? nullptr : ReadAll(payload->data(), payload_len);
  }

  void Close() {
    if (fd_ >= 0) {
      close(fd_);
      fd_ = -1;
    }
  }

 private:
  TRITONSERVER_Error* Errno(const std::string& what) {
    return MakeError(TRITONSERVER_ERROR_UNAVAILABLE, what + ": " + std::strerror(errno));
  }

  TRITONSERVER_Error* Gone() {
    return MakeError(TRITONSERVER_ERROR_UNAVAILABLE, "the torch runtime worker closed the "
                     "connection (it died or the runtime stopped)");
  }

  TRITONSERVER_Error* WriteAll(const void* data, size_t size) {
    const char* at = static_cast<const char*>(data);
    while (size > 0) {
      ssize_t sent = send(fd_, at, size, MSG_NOSIGNAL);
      if (sent < 0 && errno == EINTR) continue;
      if (sent < 0 && (errno == EPIPE || errno == ECONNRESET)) return Gone();
      if (sent <= 0) return Errno("write to the torch runtime");
      at += sent;
      size -= static_cast<size_t>(sent);
    }
    return nullptr;
  }

  TRITONSERVER_Error* ReadAll(void* data, size_t size) {
    char* at = static_cast<char*>(data);
    while (size > 0) {
      ssize_t got = recv(fd_, at, size, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got == 0) return Gone();
      if (got < 0 && errno == ECONNRESET) return Gone();
      if (got < 0) return Errno("read from the torch runtime");
      at += got;
      size -= static_cast<size_t>(got);
    }
    return nullptr;
  }

  int fd_ = -1;
};

// An extra output the worker answers after the model's own: its name and data type.
struct ExtraOutput {
  std::string name;
  TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_FP32;
};

// One model instance: its runtime worker's connection.
struct InstanceState {
  TRITONBACKEND_ModelInstance* instance = nullptr;
  std::string name;
  std::string output_name = kDefaultOutputName;
  std::vector<ExtraOutput> extras;
  RuntimeConnection runtime;
};

// The spawn reply's "extras": "name:TYPE" items, comma-separated (TYPE INT32 or FP32).
TRITONSERVER_Error* ParseExtras(const std::string& text, std::vector<ExtraOutput>* out) {
  out->clear();
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    const size_t colon = item.find(':');
    if (colon == std::string::npos || colon == 0) {
      return MakeError(TRITONSERVER_ERROR_INTERNAL, "bad extra output '" + item + "'");
    }
    ExtraOutput extra;
    extra.name = item.substr(0, colon);
    const std::string type = item.substr(colon + 1);
    if (type == "INT32") {
      extra.datatype = TRITONSERVER_TYPE_INT32;
    } else if (type != "FP32") {
      return MakeError(TRITONSERVER_ERROR_INTERNAL, "extra output " + extra.name +
                       " has unsupported type " + type);
    }
    out->push_back(extra);
    start = end + 1;
  }
  return nullptr;
}

TRITONSERVER_Error* SpawnWorker(TRITONBACKEND_ModelInstance* instance, InstanceState* state) {
  TRITONBACKEND_Model* model = nullptr;
  TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceModel(instance, &model);
  if (err != nullptr) return err;
  const char* model_name = nullptr;
  if ((err = TRITONBACKEND_ModelName(model, &model_name)) != nullptr) return err;
  TRITONBACKEND_ArtifactType artifact_type;
  const char* location = nullptr;
  if ((err = TRITONBACKEND_ModelRepository(model, &artifact_type, &location)) != nullptr) {
    return err;
  }
  TRITONSERVER_Message* config = nullptr;
  if ((err = TRITONBACKEND_ModelConfig(model, 1, &config)) != nullptr) return err;
  const char* config_json = nullptr;
  size_t config_size = 0;
  err = TRITONSERVER_MessageSerializeToJson(config, &config_json, &config_size);
  std::string header;
  if (err == nullptr) {
    header = "{\"op\":\"spawn\",\"model\":" + JsonString(model_name) +
             ",\"model_dir\":" + JsonString(location) + ",\"config\":" +
             std::string(config_json, config_size) + "}";
  }
  TRITONSERVER_Error* delete_err = TRITONSERVER_MessageDelete(config);
  if (delete_err != nullptr) TRITONSERVER_ErrorDelete(delete_err);
  if (err != nullptr) return err;

  const char* socket_path = std::getenv(kSocketEnv);
  if (socket_path == nullptr || *socket_path == '\0') {
    return MakeError(TRITONSERVER_ERROR_UNAVAILABLE,
                     std::string(kSocketEnv) + " is not set: the understudy backend serves "
                     "through the per-server torch runtime");
  }
  if ((err = state->runtime.Connect(socket_path)) != nullptr) return err;
  if ((err = state->runtime.Send(header, {})) != nullptr) return err;
  std::string reply;
  std::vector<char> unused;
  if ((err = state->runtime.Receive(&reply, &unused)) != nullptr) return err;
  if (!ReplyOk(reply)) {
    return MakeError(TRITONSERVER_ERROR_INTERNAL,
                     "loading " + std::string(model_name) + " failed: " + ReplyError(reply));
  }
  std::string output = ReplyString(reply, "output");
  if (!output.empty()) state->output_name = output;
  return ParseExtras(ReplyString(reply, "extras"), &state->extras);
}

// The input of one request (its first and only one): its shape and its CPU buffers.
struct RequestInput {
  std::vector<int64_t> shape;
  std::vector<std::pair<const void*, size_t>> buffers;
  uint64_t byte_size = 0;
};

TRITONSERVER_Error* ReadInput(TRITONBACKEND_Request* request, RequestInput* out) {
  TRITONBACKEND_Input* input = nullptr;
  TRITONSERVER_Error* err = TRITONBACKEND_RequestInputByIndex(request, 0, &input);
  if (err != nullptr) return err;
  TRITONSERVER_DataType datatype;
  const int64_t* shape = nullptr;
  uint32_t dims = 0;
  uint32_t buffer_count = 0;
  err = TRITONBACKEND_InputProperties(input, nullptr, &datatype, &shape, &dims,
                                      &out->byte_size, &buffer_count);
  if (err != nullptr) return err;
  if (datatype != TRITONSERVER_TYPE_FP32 || dims < 2) {
    return MakeError(TRITONSERVER_ERROR_INVALID_ARG,
                     "the input must be FP32 with a batch dimension");
  }
  out->shape.assign(shape, shape + dims);
  uint64_t expected = sizeof(float);
  for (int64_t d : out->shape) expected *= static_cast<uint64_t>(d);
  if (expected != out->byte_size) {
    return MakeError(TRITONSERVER_ERROR_INVALID_ARG, "the input holds " +
                     std::to_string(out->byte_size) + " bytes, its shape needs " +
                     std::to_string(expected));
  }
  for (uint32_t i = 0; i < buffer_count; ++i) {
    const void* buffer = nullptr;
    uint64_t size = 0;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_type_id = 0;
    err = TRITONBACKEND_InputBuffer(input, i, &buffer, &size, &memory_type, &memory_type_id);
    if (err != nullptr) return err;
    if (memory_type == TRITONSERVER_MEMORY_GPU) {
      return MakeError(TRITONSERVER_ERROR_UNSUPPORTED, "input in GPU memory");
    }
    out->buffers.emplace_back(buffer, static_cast<size_t>(size));
  }
  return nullptr;
}

// Triton's clock for statistics: steady-clock nanoseconds.
uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::steady_clock::now().time_since_epoch()).count());
}

// When one execution started, and when its forward pass did (both zero-length before it).
struct Timing {
  TRITONBACKEND_ModelInstance* instance = nullptr;
  uint64_t exec_start_ns = 0;
  uint64_t compute_start_ns = 0;
  uint64_t compute_end_ns = 0;
};

void Drop(TRITONSERVER_Error* err) {
  if (err != nullptr) TRITONSERVER_ErrorDelete(err);
}

// Reports `request` to Triton's statistics (its inference counters and durations), sends
// `error` (owned, may be null) as its final response, then releases it. The report comes
// first, so a client that has its answer also finds it counted.
void Finish(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response,
            TRITONSERVER_Error* error, const Timing& timing) {
  const uint64_t compute_start = timing.compute_start_ns ? timing.compute_start_ns
                                                         : timing.exec_start_ns;
  const uint64_t compute_end = timing.compute_end_ns ? timing.compute_end_ns : compute_start;
  Drop(TRITONBACKEND_ModelInstanceReportStatistics(timing.instance, request, error == nullptr,
                                                   timing.exec_start_ns, compute_start,
                                                   compute_end, NowNs()));
  TRITONSERVER_Error* err = nullptr;
  if (response == nullptr) err = TRITONBACKEND_ResponseNew(&response, request);
  if (err == nullptr) {
    err = TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error);
  }
  if (err != nullptr) {
    Log(TRITONSERVER_LOG_ERROR, __LINE__, std::string("sending a response failed: ") +
        TRITONSERVER_ErrorMessage(err));
    TRITONSERVER_ErrorDelete(err);
  }
  if (error != nullptr) TRITONSERVER_ErrorDelete(error);
  Drop(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
}

// Adds one output of `request`'s response: `dims` dimensions of 4-byte values from `data`.
TRITONSERVER_Error* AddOutput(TRITONBACKEND_Response* response, const std::string& name,
                              TRITONSERVER_DataType datatype, const int64_t* shape,
                              const void* data, uint64_t bytes) {
  TRITONBACKEND_Output* output = nullptr;
  void* buffer = nullptr;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
  int64_t memory_type_id = 0;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseOutput(response, &output, name.c_str(),
                                                         datatype, shape, 2);
  if (err == nullptr) {
    err = TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &memory_type, &memory_type_id);
  }
  if (err == nullptr && memory_type == TRITONSERVER_MEMORY_GPU) {
    err = MakeError(TRITONSERVER_ERROR_UNSUPPORTED, "output buffer in GPU memory");
  }
  if (err == nullptr) std::memcpy(buffer, data, bytes);
  return err;
}

// Answers `request` with `rows` x `classes` logits and, per extra output, `rows` values taken
// from `extras` (the batch's extra outputs, `batch_rows` values each, this request's starting
// at row `first_row`), or with the error met on the way.
void Respond(TRITONBACKEND_Request* request, const InstanceState& state, const float* logits,
             int64_t rows, int64_t classes, const char* extras, int64_t batch_rows,
             int64_t first_row, const Timing& timing) {
  TRITONBACKEND_Response* response = nullptr;
  TRITONSERVER_Error* err = TRITONBACKEND_ResponseNew(&response, request);
  if (err != nullptr) {
    Finish(request, nullptr, err, timing);
    return;
  }
  const int64_t shape[2] = {rows, classes};
  err = AddOutput(response, state.output_name, TRITONSERVER_TYPE_FP32, shape, logits,
                  static_cast<uint64_t>(rows * classes) * sizeof(float));
  const int64_t extra_shape[2] = {rows, 1};
  for (size_t e = 0; err == nullptr && e < state.extras.size(); ++e) {
    const char* values = extras + (static_cast<int64_t>(e) * batch_rows + first_row) * 4;
    err = AddOutput(response, state.extras[e].name, state.extras[e].datatype, extra_shape,
                    values, static_cast<uint64_t>(rows) * 4);
  }
  Finish(request, response, err, timing);
}

void Execute(InstanceState* state, TRITONBACKEND_Request** requests, uint32_t count) {
  Timing timing;
  timing.instance = state->instance;
  timing.exec_start_ns = NowNs();
  std::vector<RequestInput> inputs(count);
  std::vector<TRITONBACKEND_Request*> batch;
  std::vector<RequestInput*> batch_inputs;
  for (uint32_t r = 0; r < count; ++r) {
    TRITONSERVER_Error* err = ReadInput(requests[r], &inputs[r]);
    if (err == nullptr && !batch_inputs.empty()) {
      const auto& first = batch_inputs.front()->shape;
      if (!std::equal(first.begin() + 1, first.end(), inputs[r].shape.begin() + 1,
                      inputs[r].shape.end())) {
        err = MakeError(TRITONSERVER_ERROR_INVALID_ARG, "input shape differs within a batch");
      }
    }
    if (err != nullptr) {
      Finish(requests[r], nullptr, err, timing);  // a bad request fails alone
      continue;
    }
    batch.push_back(requests[r]);
    batch_inputs.push_back(&inputs[r]);
  }
  if (batch.empty()) return;

  std::vector<int64_t> shape = batch_inputs.front()->shape;
  shape[0] = 0;
  std::vector<std::pair<const void*, size_t>> payload;
  for (RequestInput* input : batch_inputs) {
    shape[0] += input->shape[0];
    payload.insert(payload.end(), input->buffers.begin(), input->buffers.end());
  }
  std::string header = "{\"op\":\"infer\",\"dtype\":\"float32\",\"shape\":[";
  for (size_t i = 0; i < shape.size(); ++i) {
    header += (i ? "," : "") + std::to_string(shape[i]);
  }
  header += "]}";

  std::string reply;
  std::vector<char> logits;
  timing.compute_start_ns = NowNs();
  TRITONSERVER_Error* err = state->runtime.Send(header, payload);
  if (err == nullptr) err = state->runtime.Receive(&reply, &logits);
  if (err != nullptr) {
    // The worker is gone (killed, out of memory): start a new one and run the batch again,
    // once, so a lost worker costs one slow batch rather than every later request.
    Log(TRITONSERVER_LOG_WARN, __LINE__, "instance " + state->name + ": " +
        TRITONSERVER_ErrorMessage(err) + "; starting a new runtime worker");
    TRITONSERVER_ErrorDelete(err);
    state->runtime.Close();
    err = SpawnWorker(state->instance, state);
    if (err == nullptr) err = state->runtime.Send(header, payload);
    if (err == nullptr) err = state->runtime.Receive(&reply, &logits);
    if (err != nullptr) state->runtime.Close();
  }
  timing.compute_end_ns = NowNs();
  if (err == nullptr && !ReplyOk(reply)) {
    err = MakeError(TRITONSERVER_ERROR_INTERNAL, "inference failed: " + ReplyError(reply));
  }
  const int64_t rows = shape[0];
  const int64_t extras = static_cast<int64_t>(state->extras.size());
  const int64_t values = rows > 0 ? static_cast<int64_t>(logits.size() / sizeof(float)) : 0;
  if (err == nullptr && (rows <= 0 || logits.size() % (rows * sizeof(float)) != 0 ||
                         values / rows <= extras)) {
    err = MakeError(TRITONSERVER_ERROR_INTERNAL, "the runtime returned " +
                    std::to_string(logits.size()) + " bytes of outputs for " +
                    std::to_string(rows) + " images");
  }
  if (err != nullptr) {
    const std::string message = TRITONSERVER_ErrorMessage(err);
    TRITONSERVER_ErrorDelete(err);
    for (TRITONBACKEND_Request* request : batch) {
      Finish(request, nullptr, MakeError(TRITONSERVER_ERROR_UNAVAILABLE, message), timing);
    }
    return;
  }
  Drop(TRITONBACKEND_ModelInstanceReportBatchStatistics(
      state->instance, static_cast<uint64_t>(rows), timing.exec_start_ns,
      timing.compute_start_ns, timing.compute_end_ns, NowNs()));
  // The payload: rows x classes logits, then `extras` blocks of rows 4-byte values.
  const int64_t classes = values / rows - extras;
  const float* at = reinterpret_cast<const float*>(logits.data());
  const char* extra_values = logits.data() + rows * classes * sizeof(float);
  int64_t first_row = 0;
  for (size_t r = 0; r < batch.size(); ++r) {
    const int64_t n = batch_inputs[r]->shape[0];
    Respond(batch[r], *state, at, n, classes, extra_values, rows, first_row, timing);
    at += n * classes;
    first_row += n;
  }
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(
    TRITONBACKEND_Model*) {
  return nullptr;  // every instance reads the model's config itself
}

__attribute__((visibility("default"))) TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(
    TRITONBACKEND_Model*) {
  return nullptr;
}

__attribute__((visibility("default"))) TRITONSERVER_Error*
TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  auto state = std::make_unique<InstanceState>();
  const char* name = nullptr;
  if (TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceName(instance, &name)) return err;
  state->instance = instance;
  state->name = name;
  if (TRITONSERVER_Error* err = SpawnWorker(instance, state.get())) return err;
  if (TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceSetState(instance, state.get())) {
    return err;
  }
  Log(TRITONSERVER_LOG_VERBOSE, __LINE__, "understudy instance " + state->name + " loaded");
  state.release();  // owned by Triton's instance until ModelInstanceFinalize
  return nullptr;
}

__attribute__((visibility("default"))) TRITONSERVER_Error*
TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  void* state = nullptr;
  if (TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceState(instance, &state)) return err;
  delete static_cast<InstanceState*>(state);  // closes the connection: the worker exits
  return nullptr;
}

__attribute__((visibility("default"))) TRITONSERVER_Error*
TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                   TRITONBACKEND_Request** requests,
                                   const uint32_t request_count) {
  void* state = nullptr;
  if (TRITONSERVER_Error* err = TRITONBACKEND_ModelInstanceState(instance, &state)) return err;
  // Every request is answered and released here, so Triton gets no error back for them.
  Execute(static_cast<InstanceState*>(state), requests, request_count);
  return nullptr;
}

}  // extern "C"
