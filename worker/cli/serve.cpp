#include "worker/cli/serve.hpp"

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <caf/all.hpp>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <optional>
#include <thread>
#include <zmq.hpp>

#include "common/cli_args.hpp"
#include "common/metrics.hpp"
#include "common/stop_signals.hpp"
#include "common/tokenizer/chat_template.hpp"
#include "common/wire/curve_keys.hpp"
#include "common/wire/protocol.hpp"
#include "common/wire/published_secrets.hpp"
#include "kernels/cpu/cpu_features.hpp"
#include "kernels/cpu/huge_pages.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "worker/cli/device_backend.hpp"
#include "worker/cli/fault_injection.hpp"
#include "worker/cli/metrics_http.hpp"
#include "worker/cli/serve_engine.hpp"
#include "worker/service/actor_protocol.hpp"
#include "worker/service/engine_actor.hpp"
#include "worker/service/link_actor.hpp"

namespace sy {
namespace {

// Moves the weights and KV cache, allocated on small pages so the worker is ready sooner, onto
// huge pages behind its readiness (docs/cpu-backend.md, "Start-up"): 2 MiB at a time, back to back
// while the engine has nothing to do and one step per busy_step_gap while it has (a collapse takes
// the process's memory map for itself, which stalls the kernels' threads), at a lower priority
// than theirs; stops between steps when the worker does.
class huge_page_promoter {
 public:
  explicit huge_page_promoter(std::shared_ptr<shared_metrics> metrics)
      : metrics_(std::move(metrics)), t_([this] { run(); }) {}
  huge_page_promoter(const huge_page_promoter&) = delete;
  huge_page_promoter& operator=(const huge_page_promoter&) = delete;
  ~huge_page_promoter() {
    stop_.store(true);
    t_.join();
  }

 private:
  bool engine_busy() const {
    std::lock_guard<std::mutex> lk(metrics_->mu);
    return metrics_->snap.engine.running > 0 || metrics_->snap.engine.waiting > 0;
  }
  void run() {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);  // this thread only (Linux)
    const auto t0 = std::chrono::steady_clock::now();
    cpu::huge_promotion r;
    bool done = false;
    auto last = t0;
    while (!stop_.load() && !done) {
      // Busy: one step per busy_step_gap, so a worker loaded from its first second still ends
      // on huge pages (each step stalls its steps for the time of one 2 MiB collapse).
      if (engine_busy() && std::chrono::steady_clock::now() - last < busy_step_gap) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      done = !cpu::promote_huge_page_step(r);
      last = std::chrono::steady_clock::now();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.advised)
      std::fprintf(stderr,
                   "switchyard-worker: huge pages advised only (the kernel refused MADV_COLLAPSE: before Linux 6.1, "
                   "or huge pages off); khugepaged moves the weights and KV cache in its own time\n");
    else if (done && (r.bytes > 0 || r.refused > 0))
      std::fprintf(stderr, "switchyard-worker: weights and KV cache on huge pages: %.0f MiB in %.2f s%s\n",
                   static_cast<double>(r.bytes) / (1 << 20), s,
                   r.refused > 0 ? (", " + std::to_string(r.refused >> 20) + " MiB left on 4 KiB pages").c_str() : "");
  }
  static constexpr std::chrono::milliseconds busy_step_gap{100};
  std::shared_ptr<shared_metrics> metrics_;
  std::atomic<bool> stop_{false};  // before t_: set up before the thread starts
  std::thread t_;
};

// --served-model-name (repeatable, as in vLLM): the names clients may use besides the file's, in
// the order given, without repeats or the file's own name.
std::vector<std::string> served_model_names(const cli_args& a, const std::string& model_id) {
  std::vector<std::string> names;
  for (const std::string& n : a.all("served-model-name")) {
    if (n.empty() || n.size() > proto::k_max_model_id_bytes)
      throw std::invalid_argument("--served-model-name must be 1 to " + std::to_string(proto::k_max_model_id_bytes) +
                                  " bytes");
    if (n != model_id && std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  }
  if (names.size() > proto::k_max_served_model_names)
    throw std::invalid_argument("--served-model-name: at most " + std::to_string(proto::k_max_served_model_names) +
                                " names");
  return names;
}

// The model file at --model, checked before anything starts: a pod whose models volume is
// missing, empty or unreadable exits at once with the path and what to check, rather than with
// the loader's error after the metrics port came up (docs/worker.md, "Pods").
void require_model_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    throw std::invalid_argument(
        "--model " + path + ": " + std::strerror(err) +
        (err == ENOENT ? ": the model file is not at this path (on Kubernetes: the models volume is not mounted "
                         "there, not filled yet, or holds another file; docs/operations.md, \"Model source\")"
                       : ""));
  }
  if (!S_ISREG(st.st_mode)) throw std::invalid_argument("--model " + path + ": not a regular file");
  if (::access(path.c_str(), R_OK) != 0)
    throw std::invalid_argument("--model " + path + ": not readable by uid " + std::to_string(::getuid()) + ": " +
                                std::strerror(errno));
}

}  // namespace

int run_serve(const cli_args& a, const char* default_model) {
  a.check_known(serve_options());
  const device_choice dev = parse_device_choice(a);  // before the model loads: a bad flag fails fast
  const std::string model_path = a.get("model", default_model);
  require_model_file(model_path);  // so does a missing model file
  // So does a bad --prompt-panels (serve_engine.hpp).
  const prompt_panels panels = parse_prompt_panels(a.get("prompt-panels", "per-step"));
  // So does a bad --chat-template. Its name, or its file's text, is what routers are sent.
  const std::string chat_override = a.has("chat-template") ? chat_template::read_option(a.get("chat-template")) : "";
  if (chat_override.size() > proto::k_max_chat_template_bytes)
    throw std::invalid_argument("--chat-template: the file is larger than " +
                                std::to_string(proto::k_max_chat_template_bytes) + " bytes");
  // SIGINT/SIGTERM are taken by sigwait below: block them before any thread starts.
  const sigset_t sigs = block_stop_signals();
  const double drain_timeout_s = a.get_float("drain-timeout-s", 30.0);
  if (drain_timeout_s < 0) throw std::invalid_argument("--drain-timeout-s must be >= 0");
  // The link's CURVE keys, read before the model loads so that a bad key file fails fast.
  link_config lc;
  lc.max_frame_bytes = static_cast<int64_t>(proto::k_max_frame_to_worker);
  if (a.has("curve-secret-key")) {
    if (!curve::available()) throw std::invalid_argument("--curve-secret-key: this libzmq has no CURVE support");
    lc.curve_secret_z85 = curve::read_key_file(a.get("curve-secret-key"), "--curve-secret-key");
    refuse_published(lc.curve_secret_z85, "--curve-secret-key " + a.get("curve-secret-key"),
                     a.has("allow-example-keys"));
    curve::from_secret(lc.curve_secret_z85);  // a key libzmq can use
  }
  if (a.has("curve-allowed-clients")) {
    if (lc.curve_secret_z85.empty()) throw std::invalid_argument("--curve-allowed-clients needs --curve-secret-key");
    lc.curve_allowed_clients = curve::read_key_list(a.get("curve-allowed-clients"), "--curve-allowed-clients");
    if (lc.curve_allowed_clients.empty())
      throw std::invalid_argument("--curve-allowed-clients: " + a.get("curve-allowed-clients") + " lists no key");
  }

  // /metrics, /health and /ready answer from the start, before the model loads: /ready says 503
  // until the model is loaded and the link bound, 200 while serving, 503 again once draining.
  auto metrics = std::make_shared<shared_metrics>();
  auto link_counts = std::make_shared<link_counters>();
  enum class phase : int { loading, serving, draining };
  auto now = std::make_shared<std::atomic<phase>>(phase::loading);
  std::unique_ptr<metrics_http> http;
  const int metrics_port = static_cast<int>(a.get_int("metrics-port", 9100));
  if (metrics_port >= 0)
    http = std::make_unique<metrics_http>(
        a.get("metrics-host", "127.0.0.1"), metrics_port,
        [metrics, link_counts] {
          metrics_snapshot copy;
          {
            std::lock_guard<std::mutex> lk(metrics->mu);
            copy = metrics->snap;
          }
          std::string out = render_metrics(copy);
          out += render_link_metrics(*link_counts);
          metric(out, "switchyard_worker_huge_page_pending_bytes", "gauge",
                 "Weights and KV cache still on small pages, waiting to move onto huge pages after start-up.",
                 static_cast<double>(cpu::deferred_huge_page_bytes()));
          return out;
        },
        [now, link_counts]() -> std::string {
          switch (now->load()) {
            case phase::loading:
              return "loading the model";
            case phase::serving:
              return link_counts->bound ? "" : "binding the link";
            case phase::draining:
              return "draining";
          }
          return "unknown";
        });

  cpu::thread_pool pool(static_cast<int>(a.get_int("threads", 0)));
  const auto t_start = std::chrono::steady_clock::now();
  auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  if (!dev.cuda) cpu::defer_huge_pages();  // small pages until ready, huge ones behind it
  auto model = llama_model::load(model_path, pool);
  const double load_s = seconds_since(t_start);
  if (!dev.cuda) apply_prompt_panels(panels, *model, pool, "switchyard-worker");
  const auto t_engine = std::chrono::steady_clock::now();
  std::unique_ptr<engine> eng = make_serve_engine(a, dev, *model, pool);
  const engine_config& used = eng->config();  // the backend's KV size
  const double engine_s = seconds_since(t_engine);

  service_config sc;
  sc.worker_id = a.get("worker-id", "worker-" + std::to_string(::getpid()));
  sc.model_id = model_path.substr(model_path.find_last_of('/') + 1);
  if (sc.model_id.size() > 5 && sc.model_id.substr(sc.model_id.size() - 5) == ".gguf")
    sc.model_id.resize(sc.model_id.size() - 5);
  sc.chat_template = chat_override;
  sc.drop_first_frames = dropped_frames_of(a.get("fault-inject", ""));  // tests only
  sc.mute_first_requests = muted_requests_of(a.get("fault-inject", ""));
  sc.served_model_names = served_model_names(a, sc.model_id);
  if (chat_override.empty() && !model->chat().supported())
    std::fprintf(stderr,
                 "switchyard-worker: warning: the chat template of %s cannot be applied (%s); routers will refuse "
                 "/v1/chat/completions for it (completions work). Pass --chat-template NAME (%s) or a Jinja file.\n",
                 sc.model_id.c_str(), model->chat().unsupported_reason.c_str(), chat_format_names().c_str());

  zmq::context_t ctx(1);
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto engine_act = sys.spawn<caf::detached>(engine_actor, &ctx, eng.get(), sc, metrics);
  auto stop = std::make_shared<std::atomic<bool>>(false);
  lc.listen = a.get("listen", "tcp://127.0.0.1:5555");
  lc.high_water_mark = static_cast<int>(a.get_int("hwm", 10000));
  lc.max_backlog = static_cast<size_t>(std::max<int64_t>(1, a.get_int("link-backlog", 100000)));
  lc.engine_silence =
      std::chrono::milliseconds(static_cast<int64_t>(std::max(0.0, a.get_float("engine-silence-s", 60)) * 1000));
  auto link_act = sys.spawn(link_actor, &ctx, lc, engine_act, stop, link_counts);
  now->store(phase::serving);  // ready once the link has bound (link_counts->bound)

  const std::string device =
      dev.cuda ? eng->backend().describe() : std::string("cpu (") + cpu::kernel_isa_name() + " kernels)";
  std::fprintf(
      stderr,
      "switchyard-worker: serving %s on %s (metrics %s) on %s; %d KV blocks x %d tokens (%.0f MiB %s), "
      "max context %lld, max running %d, %d threads; link %s; model loaded in %.2f s, KV cache and engine "
      "in %.2f s\n",
      sc.model_id.c_str(), lc.listen.c_str(),
      http ? ("http://" + a.get("metrics-host", "127.0.0.1") + ":" + std::to_string(http->port()) + "/metrics").c_str()
           : "off",
      device.c_str(), used.n_kv_blocks, used.block_size, static_cast<double>(eng->backend().kv_bytes()) / (1 << 20),
      cpu::kv_type_name(used.kv_type), static_cast<long long>(used.max_context), used.sched.max_running, pool.size(),
      lc.curve_secret_z85.empty()        ? "unauthenticated (no --curve-secret-key)"
      : lc.curve_allowed_clients.empty() ? "CURVE (any router with the worker's public key)"
                                         : "CURVE (listed routers only)",
      load_s, engine_s);
  std::optional<huge_page_promoter> promoter;  // after the model and engine: stopped before they go
  if (!dev.cuda) promoter.emplace(metrics);

  // Wait for SIGINT/SIGTERM (or the link dying, e.g. a bind failure), then drain: /ready says
  // 503, accept nothing new, finish what is running (--drain-timeout-s at most), stop. A second
  // signal stops at once.
  auto link_alive = std::make_shared<std::atomic<bool>>(true);
  // Spawn arguments, not captures: CAF 0.17 starts an actor spawned without arguments by
  // dereferencing a null std::shared_ptr<std::tuple<>> (caf/detail/init_fun_factory.hpp), which
  // UBSan reports (the ASan + UBSan worker of tests/sanitize.sh, SANITIZE_WORKER=1).
  sys.spawn(
      [](caf::event_based_actor* self, caf::actor link_act, std::shared_ptr<std::atomic<bool>> link_alive) {
        self->monitor(link_act);
        self->set_down_handler([link_alive, self](caf::down_msg& dm) {
          link_alive->store(false);
          if (dm.reason && dm.reason != caf::exit_reason::normal)
            std::fprintf(stderr, "switchyard-worker: link stopped: %s\n", caf::to_string(dm.reason).c_str());
          ::kill(::getpid(), SIGTERM);  // process-directed: main's sigwait takes it
          self->quit();
        });
      },
      link_act, link_alive);
  int sig = 0;
  sigwait(&sigs, &sig);
  now->store(phase::draining);
  std::fprintf(stderr, "switchyard-worker: %s, draining (at most %g s)\n",
               link_alive->load() ? "signal received" : "link failed", drain_timeout_s);
  caf::anon_send(engine_act, drain_atom::value);
  const auto drained = [&] {
    std::lock_guard<std::mutex> lk(metrics->mu);
    return metrics->snap.draining && metrics->snap.engine.running == 0 && metrics->snap.engine.waiting == 0;
  };
  const bool cut_short = !wait_unless_signalled(sigs, drain_timeout_s, drained);
  if (!drained())
    std::fprintf(stderr, "switchyard-worker: %s: stopping with requests unfinished\n",
                 cut_short ? "second signal" : "drain timeout");
  // The engine actor first, the link after it: the engine writes to the link's inbox, and a
  // send to an inproc socket whose reader has gone blocks forever (shutdown would hang).
  {
    caf::scoped_actor self{sys};
    self->send_exit(engine_act, caf::exit_reason::user_shutdown);
    self->wait_for(engine_act);
  }
  stop->store(true);
  return link_alive->load() ? 0 : 1;
}

}  // namespace sy
