// CPU feature detection with __builtin_cpu_supports, so a library built on one machine picks safe
// kernels on another. The active path starts as the best available one, or the one named by the
// environment variable BONSAI_CPU_PATH (an unknown or unsupported name is an error on first use).
#include "cpu_features.h"

#include <atomic>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "bonsai/error.h"

namespace bonsai {

namespace cpu {

namespace {

#if defined(__x86_64__) || defined(__i386__)
// F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" for __builtin_cpu_supports.
bool cpuid_has_f16c() {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
    return (ecx & bit_F16C) != 0;
}
#endif

}  // namespace

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           cpuid_has_f16c();
    return ok;
#else
    return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
    static const bool ok = cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                           __builtin_cpu_supports("avx512vnni");
    return ok;
#else
    return false;
#endif
}

bool cpu_has_avx512_vbmi() {
#if defined(__x86_64__) || defined(__i386__)
    // The VBMI kernels also use GFNI (2-bit fields); every CPU with AVX-512 VBMI but Cannon Lake has it.
    static const bool ok = cpu_has_avx512() && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni");
    return ok;
#else
    return false;
#endif
}

namespace {
std::atomic<bool> g_vbmi_enabled{true};
}  // namespace

bool avx512_vbmi_enabled() { return g_vbmi_enabled.load(std::memory_order_relaxed) && cpu_has_avx512_vbmi(); }

void set_avx512_vbmi_enabled(bool enabled) { g_vbmi_enabled.store(enabled, std::memory_order_relaxed); }

bool cpu_path_available(CpuPath path) {
    switch (path) {
        case CpuPath::SCALAR: return true;
        case CpuPath::AVX2: return cpu_has_avx2();
        case CpuPath::AVX512: return cpu_has_avx512();
    }
    return false;
}

}  // namespace cpu

namespace {

CpuPath best_path() {
    if (cpu::cpu_has_avx512()) return CpuPath::AVX512;
    if (cpu::cpu_has_avx2()) return CpuPath::AVX2;
    return CpuPath::SCALAR;
}

void require_available(CpuPath path) {
    if (!cpu::cpu_path_available(path))
        throw Error(std::string("CPU path '") + cpu_path_name(path) +
                    "' is not supported by this CPU; use one of the paths listed by "
                    "available_cpu_paths() (or unset BONSAI_CPU_PATH)");
}

CpuPath initial_path() {
    const char* env = std::getenv("BONSAI_CPU_PATH");
    if (!env || !*env) return best_path();
    const CpuPath p = parse_cpu_path(env);
    require_available(p);
    return p;
}

std::atomic<int>& path_slot() {
    static std::atomic<int> slot{-1};
    return slot;
}

}  // namespace

const char* cpu_path_name(CpuPath path) {
    switch (path) {
        case CpuPath::SCALAR: return "scalar";
        case CpuPath::AVX2: return "avx2";
        case CpuPath::AVX512: return "avx512";
    }
    return "unknown";
}

CpuPath parse_cpu_path(const std::string& name) {
    if (name == "scalar") return CpuPath::SCALAR;
    if (name == "avx2") return CpuPath::AVX2;
    if (name == "avx512") return CpuPath::AVX512;
    throw Error("unknown CPU path '" + name + "' (BONSAI_CPU_PATH / path): use scalar, avx2 or avx512");
}

std::vector<CpuPath> available_cpu_paths() {
    std::vector<CpuPath> out{CpuPath::SCALAR};
    if (cpu::cpu_has_avx2()) out.push_back(CpuPath::AVX2);
    if (cpu::cpu_has_avx512()) out.push_back(CpuPath::AVX512);
    return out;
}

CpuPath active_cpu_path() {
    int v = path_slot().load(std::memory_order_acquire);
    if (v < 0) {
        v = static_cast<int>(initial_path());
        path_slot().store(v, std::memory_order_release);
    }
    return static_cast<CpuPath>(v);
}

void set_cpu_path(CpuPath path) {
    require_available(path);
    path_slot().store(static_cast<int>(path), std::memory_order_release);
}

}  // namespace bonsai
