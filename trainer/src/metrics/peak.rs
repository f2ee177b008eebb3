//! The peak TFLOP/s that MFU is measured against, and how it was obtained.
//!
//! * `metrics.peak_tflops` when set (the user's number, used as is).
//! * GPUs: the vendor's dense peak for the compute type, by adapter name ([`gpu_peak`]).
//!   float32 compute is measured against the TF32 tensor-core peak, the fastest float32 matmul
//!   the card has, so the MFU cannot pass 100 % whichever path the matmul takes.
//! * CPU: the larger of the arithmetic ceiling `threads × f32 lanes × 2 FMA units × 2 flop ×
//!   clock` (from the CPU's flags and its clock) and the best of several runs of the model's own
//!   linear path ([`measure_linear_tflops`]): a stable number the model can never beat, where the
//!   old measured-once peak swung 0.11–0.20 TFLOP/s between starts on a shared VM and gave MFUs
//!   above 100 %.
//!
//! A peak titan-rs obtained itself is also raised to any throughput a logging window achieves
//! ([`crate::metrics::MetricsLogger`]), so an MFU above 100 % never comes from our own number.

use crate::config::{DeviceKind, Precision};
use burn::prelude::*;
use std::time::Instant;

#[derive(Debug, Clone)]
pub struct Peak {
    /// TFLOP/s of the device share one rank computes on.
    pub tflops: f64,
    /// How it was obtained, for the start-up line.
    pub how: String,
    /// Obtained by titan-rs (table or measurement), not given by the user.
    pub own: bool,
}

/// The peak for one rank. `ranks_sharing` ranks compute on the same device (thread ranks share
/// the CPU's cores or one GPU), so each gets that share. `None`: a GPU not in the table and no
/// `metrics.peak_tflops` (MFU is then not reported).
pub fn resolve(
    configured: Option<f64>,
    device_kind: DeviceKind,
    device: &Device,
    compute_dtype: Precision,
    ranks_sharing: usize,
) -> Option<Peak> {
    let share = |p: Peak| {
        if ranks_sharing <= 1 {
            return p;
        }
        let n = ranks_sharing as f64;
        Peak { tflops: p.tflops / n, how: format!("{} ÷ {ranks_sharing} ranks sharing the device", p.how), ..p }
    };
    if let Some(configured) = configured {
        return Some(share(Peak { tflops: configured, how: "metrics.peak_tflops".into(), own: false }));
    }
    if device_kind.is_gpu() {
        let adapter = crate::device::selected_adapter().unwrap_or_default();
        return gpu_peak(&adapter, compute_dtype).map(|(t, row)| {
            share(Peak { tflops: t, how: format!("{adapter}: {row} dense {compute_dtype} peak (table)"), own: true })
        });
    }
    let threads = rayon::current_num_threads();
    let measured = measure_linear_tflops(device, 5);
    let p = match cpu_ceiling(threads) {
        Some(c) if c.tflops >= measured => Peak {
            tflops: c.tflops,
            how: format!("{} (the model's linear path reaches {measured:.3})", c.describe()),
            own: true,
        },
        // The reported clock is below the one the cores run at (a VM reports its base clock;
        // turbo is higher): what the linear path achieves is the better bound.
        Some(c) => Peak {
            tflops: measured,
            how: format!(
                "the model's linear path, best of 40 runs; the CPU reports {:.2} GHz (ceiling {:.3}) but runs at ≥ {:.2} GHz",
                c.ghz,
                c.tflops,
                c.ghz * measured / c.tflops
            ),
            own: true,
        },
        None => Peak { tflops: measured, how: "the model's linear path, best of 40 runs".into(), own: true },
    };
    Some(share(p))
}

/// The CPU's arithmetic ceiling for float32.
#[derive(Debug, Clone, PartialEq)]
pub struct CpuCeiling {
    pub threads: usize,
    /// float32 lanes of the widest FMA the CPU has.
    pub lanes: usize,
    pub isa: &'static str,
    pub fma_units: usize,
    pub ghz: f64,
    pub tflops: f64,
}

impl CpuCeiling {
    pub fn new(threads: usize, lanes: usize, isa: &'static str, ghz: f64) -> Self {
        // Two FMA pipes per core: every x86 core with AVX2 or AVX-512 FMA since Haswell and
        // Skylake-SP Gold/Platinum; where a core has one, the ceiling is 2× high (MFU low).
        let fma_units = 2;
        let tflops = (threads * lanes * fma_units * 2) as f64 * ghz * 1e9 / 1e12;
        Self { threads, lanes, isa, fma_units, ghz, tflops }
    }

    pub fn describe(&self) -> String {
        format!(
            "{:.3} = {} threads × {} f32 lanes ({}) × {} FMA units × 2 flop × {:.2} GHz",
            self.tflops, self.threads, self.lanes, self.isa, self.fma_units, self.ghz
        )
    }
}

/// The ceiling on this CPU for `threads` threads, if its clock can be read.
pub fn cpu_ceiling(threads: usize) -> Option<CpuCeiling> {
    let (lanes, isa) = simd_width();
    Some(CpuCeiling::new(threads, lanes, isa, cpu_ghz()?))
}

fn simd_width() -> (usize, &'static str) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return (16, "AVX-512");
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return (8, "AVX2+FMA");
        }
        (4, "SSE")
    }
    #[cfg(not(target_arch = "x86_64"))]
    (4, "128-bit SIMD")
}

/// The highest clock the CPU reports: the cpufreq maximum (turbo) where the kernel exposes it,
/// otherwise the largest `cpu MHz` in `/proc/cpuinfo`.
fn cpu_ghz() -> Option<f64> {
    let max_khz = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok());
    if let Some(khz) = max_khz.filter(|k| *k > 0.0) {
        return Some(khz / 1e6);
    }
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    parse_cpuinfo_mhz(&info).map(|mhz| mhz / 1e3)
}

/// The largest `cpu MHz` value in `/proc/cpuinfo` text.
pub fn parse_cpuinfo_mhz(info: &str) -> Option<f64> {
    info.lines()
        .filter(|l| l.starts_with("cpu MHz"))
        .filter_map(|l| l.split(':').nth(1)?.trim().parse::<f64>().ok())
        .filter(|m| *m > 0.0)
        .max_by(f64::total_cmp)
}

/// Achieved TFLOP/s of a 1024³ float32 product through the model's linear-layer path (on the
/// CPU the kernels' threaded GEMM), the best of `rounds` rounds of 8 runs.
pub fn measure_linear_tflops(device: &Device, rounds: usize) -> f64 {
    let n = 1024;
    let a = Tensor::<2>::ones([n, n], device);
    let b = Tensor::<2>::ones([n, n], device);
    let mut best = f64::MAX;
    for _ in 0..rounds * 8 {
        let t = Instant::now();
        let c: f32 = titan_kernels::linear(a.clone(), b.clone(), true).slice([0..1, 0..1]).into_scalar();
        assert_eq!(c, n as f32);
        best = best.min(t.elapsed().as_secs_f64());
    }
    2.0 * (n as f64).powi(3) / best / 1e12
}

/// Dense peak TFLOP/s of a known GPU for `compute_dtype` (bfloat16/float16: the tensor-core
/// peak; float32: the TF32 tensor-core peak), and the table row that matched. Vendors' data
/// sheets; TorchTitan's table (`tools/utils.py::get_peak_flops`) for the NVIDIA bf16 rows.
pub fn gpu_peak(adapter: &str, compute_dtype: Precision) -> Option<(f64, &'static str)> {
    // (name substring, bf16/fp16, tf32) — longer names first (H100 NVL before H100, L40S before L4).
    const TABLE: &[(&str, f64, f64)] = &[
        ("GH200", 989.0, 494.7),
        ("H200", 989.0, 494.7),
        ("H100 NVL", 835.0, 417.5),
        ("H100 PCIE", 756.0, 378.0),
        ("H100", 989.0, 494.7),
        ("H800", 989.0, 494.7),
        ("H20", 148.0, 74.0),
        ("B200", 2250.0, 1100.0),
        ("A100", 312.0, 156.0),
        ("A800", 312.0, 156.0),
        ("L40S", 362.0, 183.0),
        ("L40", 181.0, 90.5),
        ("L4", 121.0, 60.0),
        ("A10G", 70.0, 35.0),
        ("A10", 125.0, 62.5),
        ("V100", 125.0, 15.7),
        ("MI300X", 1307.4, 653.7),
        ("MI325X", 1307.4, 653.7),
        ("MI250X", 383.0, 95.7),
    ];
    let name = adapter.to_uppercase();
    let half = compute_dtype.is_half();
    TABLE.iter().find(|(k, ..)| name.contains(k)).map(|&(k, h, f)| (if half { h } else { f }, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_is_threads_lanes_fma_and_clock() {
        let c = CpuCeiling::new(2, 16, "AVX-512", 2.6);
        assert!((c.tflops - 0.3328).abs() < 1e-9, "{}", c.tflops);
        assert!(c.describe().contains("2 threads × 16 f32 lanes (AVX-512) × 2 FMA units"));
    }

    #[test]
    fn cpuinfo_clock_is_the_largest_reported() {
        let info = "processor\t: 0\ncpu MHz\t\t: 2599.998\nprocessor\t: 1\ncpu MHz\t\t: 3100.5\nflags : fma";
        assert_eq!(parse_cpuinfo_mhz(info), Some(3100.5));
        assert_eq!(parse_cpuinfo_mhz("flags: avx2"), None);
    }

    #[test]
    fn gpu_table_matches_names_and_dtypes() {
        assert_eq!(gpu_peak("NVIDIA H200", Precision::BFloat16), Some((989.0, "H200")));
        assert_eq!(gpu_peak("NVIDIA H100 PCIe", Precision::Float32), Some((378.0, "H100 PCIE")));
        assert_eq!(gpu_peak("NVIDIA L40S", Precision::Float16), Some((362.0, "L40S")));
        assert_eq!(gpu_peak("NVIDIA L4", Precision::BFloat16), Some((121.0, "L4")));
        assert_eq!(gpu_peak("llvmpipe (LLVM 15.0.6, 256 bits)", Precision::Float32), None);
    }

    /// The CPU peak is the ceiling or the best of 40 runs of the model's GEMM path, and whatever
    /// a run achieves above it raises it (tested with the logger), so MFU stays ≤ 100 %. (How
    /// close later measurements come is a timing, shown by `bench`, not asserted here: tests
    /// running beside this one change it.)
    #[test]
    fn cpu_peak_is_obtained_and_shared() {
        let device = Device::flex();
        let peak = resolve(None, DeviceKind::Cpu, &device, Precision::Float32, 1).expect("a CPU peak");
        assert!(peak.own && peak.tflops > 0.0, "{peak:?}");
        let half = resolve(None, DeviceKind::Cpu, &device, Precision::Float32, 2).unwrap();
        assert!(half.tflops < peak.tflops * 0.75 && half.how.contains("2 ranks"), "{half:?}");
        let user = resolve(Some(0.5), DeviceKind::Cpu, &device, Precision::Float32, 2).unwrap();
        assert_eq!((user.tflops, user.own), (0.25, false));
    }
}
