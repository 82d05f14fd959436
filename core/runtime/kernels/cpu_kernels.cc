// Fused CPU kernels for MindSpore 2.10's AOT custom ops (ops.Custom(func_type="aot")): the optimizer's hot path,
// where MindSpore runs one kernel per parameter and per element-wise step, each a full pass over memory.
//
//   msar_sum_squares(weights (n,), x_0 .. x_{n-1})                    -> (1,) float32: sum_i weight_i * sum(x_i^2)
//   msar_adamw(lr, eps, decay, scale, betas (2,), decays (n,), p_0.., g_0.., m_0.., v_0..) -> (1,) token;
//              p, m and v updated in place
//
// Every AOT entry point has MindSpore's signature: params holds the inputs' then the outputs' data pointers, shapes
// and ndims their shapes. All tensors are float32 and contiguous: core.optim.Optimizer refuses fused=True for other
// parameter dtypes, and gradients have their parameters' dtype. Work is cut into fixed chunks that a small pool of
// threads shares, and partial sums are added in chunk order, so every result is the same whatever the number of
// threads.
//
// Built by setuptools as the extension module core.runtime.kernels._cpu_kernels (pyproject.toml); Python imports it for
// its path and for set_threads(n), MindSpore's AOT loader dlopens the same file.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

// The loops are compiled for the baseline ISA and, on x86-64, also for AVX2 and AVX-512, picked at load time for the
// machine at hand: a built package runs on any x86-64 CPU and still uses the vector units of this one.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MSAR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MSAR_CLONES
#endif

namespace {

constexpr int64_t kChunk = 1 << 15;  // elements per work item: 128 KiB of float32, a few microseconds of work

// ---- a pool of helper threads that sleep between jobs ------------------------------------------------------------
// MindSpore's own kernel threads spin (yielding) between its kernels; helpers that spun too would take their cores.
// So a helper spins only briefly after a job, then blocks on a futex (std::atomic::wait) until the next one.
class Pool {
 public:
  static Pool &get() {
    static Pool *pool = new Pool();  // never destroyed: its detached threads may outlive static destructors
    return *pool;
  }

  void set_threads(int n) { threads_.store(n < 1 ? 1 : n); }

  // fn(ctx, i) for every i in [0, n), shared by the caller and up to threads - 1 helpers; returns when all are done.
  // A second caller while a job runs (MindSpore may launch two kernels at once) does its job alone.
  void run(int64_t n, void (*fn)(void *, int64_t), void *ctx) {
    int helpers = static_cast<int>(std::min<int64_t>(threads_.load(), n)) - 1;
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (helpers <= 0 || !lock.owns_lock()) {
      for (int64_t i = 0; i < n; ++i) fn(ctx, i);
      return;
    }
    start(helpers);
    fn_ = fn;
    ctx_ = ctx;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    active_.store(helpers, std::memory_order_relaxed);
    wanted_ = helpers;
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    work();
    for (int spin = 0; active_.load(std::memory_order_acquire) != 0; ++spin) {
      if (spin > 4096) {
        int a = active_.load(std::memory_order_acquire);
        if (a != 0) active_.wait(a, std::memory_order_acquire);
      }
    }
  }

  void after_fork_in_child() { started_ = 0; }  // the child has none of the parent's threads

 private:
  void work() {
    for (int64_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n_;) fn_(ctx_, i);
  }

  void start(int helpers) {  // before the job is posted: a new helper waits for the generation after this one
    const unsigned now = generation_.load(std::memory_order_relaxed);
    for (; started_ < helpers; ++started_) std::thread([this, id = started_, now] { loop(id, now); }).detach();
  }

  void loop(int id, unsigned seen) {
    for (;;) {
      unsigned g;
      for (int spin = 0; (g = generation_.load(std::memory_order_acquire)) == seen; ++spin) {
        if (spin > 4096) generation_.wait(seen, std::memory_order_acquire);
      }
      seen = g;
      if (id >= wanted_) continue;  // this job wants fewer helpers
      work();
      if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) active_.notify_one();
    }
  }

  std::mutex busy_;
  std::atomic<int> threads_{1};
  int started_ = 0, wanted_ = 0;
  std::atomic<unsigned> generation_{0};
  std::atomic<int64_t> next_{0};
  std::atomic<int> active_{0};
  void (*fn_)(void *, int64_t) = nullptr;
  void *ctx_ = nullptr;
  int64_t n_ = 0;
};

int64_t numel(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

// (tensor, first element, end) of every chunk of n tensors, in tensor order.
struct Item {
  int tensor;
  int64_t begin, end;
};

std::vector<Item> chunks(int n, int first, const int *ndims, int64_t **shapes) {
  std::vector<Item> items;
  for (int t = 0; t < n; ++t) {
    int64_t size = numel(ndims[first + t], shapes[first + t]);
    for (int64_t b = 0; b < size; b += kChunk) items.push_back({t, b, std::min(size, b + kChunk)});
  }
  return items;
}

// ---- sum of squares ----------------------------------------------------------------------------------------------
struct SumSquares {
  float **x;
  const std::vector<Item> *items;
  std::vector<double> partial;
};

MSAR_CLONES void sum_squares_item(void *ctx, int64_t i) {
  auto *s = static_cast<SumSquares *>(ctx);
  const Item &it = (*s->items)[i];
  const float *x = s->x[it.tensor];
  // Eight lanes in double, added in a fixed order: vectorises without reassociating, and loses no digits over
  // millions of terms (float32 accumulation would).
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = it.begin;
  for (; j + 8 <= it.end; j += 8)
    for (int k = 0; k < 8; ++k) lane[k] += static_cast<double>(x[j + k]) * x[j + k];
  double total = 0;
  for (; j < it.end; ++j) total += static_cast<double>(x[j]) * x[j];
  for (int k = 0; k < 8; ++k) total += lane[k];
  s->partial[i] = total;
}

// ---- AdamW ------------------------------------------------------------------------------------------------------
struct AdamW {
  float lr, eps, decay, scale, beta1, beta2;
  const float *decays;
  float **p, **g, **m, **v;
  const std::vector<Item> *items;
};

MSAR_CLONES void adamw_item(void *ctx, int64_t i) {
  const auto *a = static_cast<const AdamW *>(ctx);
  const Item &it = (*a->items)[i];
  float *p = a->p[it.tensor], *m = a->m[it.tensor], *v = a->v[it.tensor];
  const float *g = a->g[it.tensor];
  const float keep = 1.0f - a->decay * a->decays[it.tensor], b1 = a->beta1, b2 = a->beta2;
  const float c1 = 1.0f - b1, c2 = 1.0f - b2, lr = a->lr, eps = a->eps, scale = a->scale;
  for (int64_t j = it.begin; j < it.end; ++j) {
    const float gj = g[j] * scale;
    const float mj = b1 * m[j] + c1 * gj;
    const float vj = b2 * v[j] + c2 * gj * gj;
    m[j] = mj;
    v[j] = vj;
    p[j] = p[j] * keep - lr * mj / (std::sqrt(vj) + eps);
  }
}

float **floats(void **params, int first) { return reinterpret_cast<float **>(params + first); }

}  // namespace

// ---- the AOT entry points ----------------------------------------------------------------------------------------
extern "C" int msar_sum_squares(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *,
                                void *) {
  const int n = nparam - 2;  // weights, n tensors, the output
  const float *weights = static_cast<const float *>(params[0]);
  std::vector<Item> items = chunks(n, 1, ndims, shapes);
  SumSquares s{floats(params, 1), &items, std::vector<double>(items.size())};
  Pool::get().run(static_cast<int64_t>(items.size()), sum_squares_item, &s);
  std::vector<double> per_tensor(n, 0.0);
  for (size_t i = 0; i < items.size(); ++i) per_tensor[items[i].tensor] += s.partial[i];
  double total = 0;
  for (int t = 0; t < n; ++t) total += weights[t] * per_tensor[t];
  static_cast<float *>(params[nparam - 1])[0] = static_cast<float>(total);
  return 0;
}

// lr and eps: Adam's, bias corrections folded in (core/optim/adamw.py); decay: lr * weight_decay; scale: what every
// gradient is multiplied by first (clipping and averaging); all 0-d. betas (2,); decays (n,): 1 for a parameter
// that decays, 0 otherwise. p, m and v are written in place; the output is a token for the graph's data flow.
extern "C" int msar_adamw(int nparam, void **params, int *ndims, int64_t **shapes, const char **, void *, void *) {
  const int n = (nparam - 7) / 4;  // lr, eps, decay, scale, betas, decays, 4 x n tensors, the output
  auto scalar = [&](int i) { return static_cast<const float *>(params[i])[0]; };
  const float *betas = static_cast<const float *>(params[4]);
  std::vector<Item> items = chunks(n, 6, ndims, shapes);
  AdamW a{scalar(0), scalar(1), scalar(2), scalar(3), betas[0], betas[1], static_cast<const float *>(params[5]),
          floats(params, 6), floats(params, 6 + n), floats(params, 6 + 2 * n), floats(params, 6 + 3 * n), &items};
  Pool::get().run(static_cast<int64_t>(items.size()), adamw_item, &a);
  static_cast<float *>(params[nparam - 1])[0] = 0.0f;
  return 0;
}

// ---- the Python module: its file is what MindSpore loads; set_threads sizes the pool -----------------------------
static PyObject *set_threads(PyObject *, PyObject *arg) {
  long n = PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  Pool::get().set_threads(static_cast<int>(n));
  Py_RETURN_NONE;
}

static PyMethodDef kMethods[] = {
    {"set_threads", set_threads, METH_O, "set_threads(n): threads (the caller's included) each kernel may use"},
    {nullptr, nullptr, 0, nullptr}};

static PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_cpu_kernels",
                              "Fused CPU kernels loaded by MindSpore's AOT custom ops (core.runtime.kernels).", -1, kMethods};

PyMODINIT_FUNC PyInit__cpu_kernels() {
  pthread_atfork(nullptr, nullptr, [] { Pool::get().after_fork_in_child(); });
  return PyModule_Create(&kModule);
}
