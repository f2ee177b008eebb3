//! Every CubeCL kernel of this crate built the way its launch builds it, but without a device:
//! the kernel definitions a compiler turns into device code, for a GPU this machine does not
//! have. The launch-time choices (threads per cube, attention tile rows, loop unrolling) come
//! from the same functions the launches call, fed the target's properties instead of a client's.
//! With the `cuda` feature, [`super::ptx`] compiles them to PTX through cubecl-cuda's own
//! compiler (`titan-rs ptx`; `scripts/gpu/ptx_report.py` assembles them with NVIDIA's `ptxas`
//! for registers, spills and shared memory per kernel).

use super::{adamw, flash, grouped, kernels, reduce, rows, rows_serial};
use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::DType;
use cubecl::ir::{DeviceIdentity, HardwareProperties, MemoryDeviceProperties};
use cubecl::prelude::*;
use cubecl::CubeKernel;
use std::sync::Arc;

/// What the launches read from a device: shared memory per cube, threads per cube, plane width.
#[derive(Clone, Debug)]
pub struct Target {
    /// A name for reports (`"sm_90"`).
    pub name: String,
    /// Shared memory one cube may use, in bytes (the attention tiles are sized from it).
    pub max_shared_memory_size: usize,
    /// Threads one cube may have.
    pub max_units_per_cube: u32,
    /// Threads of a plane (warp).
    pub plane_size: u32,
}

impl Target {
    /// An NVIDIA Hopper GPU (H100, H200) as cubecl-cuda sees it: 227 KiB of shared memory a
    /// block (the opt-in limit), 1 024 threads a block, warps of 32.
    pub fn hopper() -> Self {
        Target { name: "sm_90".into(), max_shared_memory_size: 232_448, max_units_per_cube: 1024, plane_size: 32 }
    }

    /// The device properties the kernels' expansion reads. (Loops over compile-time sizes are
    /// unrolled, as the launches decide on a physical GPU: [`kernels`] passes `unroll` itself.)
    pub fn device_properties(&self) -> DeviceProperties {
        let hardware = HardwareProperties {
            load_width: 128,
            vector_register_count: None,
            plane_size_min: self.plane_size,
            plane_size_max: self.plane_size,
            max_bindings: 32,
            max_shared_memory_size: self.max_shared_memory_size,
            max_cube_count: (u32::MAX, u16::MAX as u32, u16::MAX as u32),
            max_units_per_cube: self.max_units_per_cube,
            max_cube_dim: (self.max_units_per_cube, self.max_units_per_cube, 64),
            num_streaming_multiprocessors: None,
            num_tensor_cores: None,
            min_tensor_cores_dim: None,
            num_cpu_cores: None,
            last_level_cache_size: None,
            max_vector_size: VectorSize::MAX,
            cube_mma_reserved_shared_memory: 0,
        };
        let mut features = cubecl::ir::features::Features::default();
        features.plane.insert(cubecl::ir::features::Plane::Ops);
        DeviceProperties::new(
            features,
            MemoryDeviceProperties::new(u64::MAX, 256),
            hardware,
            cubecl::profile::TimingMethod::Device,
            DeviceIdentity { name: self.name.clone(), fingerprint: self.name.clone(), physical: None },
        )
    }

    /// Threads a cube of the one-thread-per-element kernels gets on a large tensor
    /// (`CubeDim::new(client, n)`: whole planes up to the cube limit).
    fn elementwise(&self) -> CubeDim {
        CubeDim::new_2d(self.plane_size, (self.max_units_per_cube / self.plane_size).max(1))
    }
}

/// One kernel as its launch builds it: a name for reports (kernel, float type, variant) and the
/// kernel itself, ready for a compiler's `define`.
pub struct OfflineKernel {
    pub name: String,
    pub kernel: Box<dyn CubeKernel>,
}

/// A tensor argument as a launch registers it: its own buffer, not aliased.
fn tensor() -> TensorCompilationArg {
    TensorCompilationArg { meta: TensorMetaCompilationArg { len: (), rank: () }, buffer: BufferCompilationArg { inplace: None } }
}

/// Every kernel of [`super`] for floats of `dtype` (float32, float16 or bfloat16) on `target`,
/// the attention kernels for heads of `head_dim`, integers (targets, document starts, group
/// sizes) as int32 as burn's CubeCL backend stores them.
pub fn kernels(target: &Target, dtype: DType, head_dim: usize) -> Vec<OfflineKernel> {
    let props = Arc::new(target.device_properties());
    let runtime = Arc::new(TargetProperties::default());
    let f = dtype_to_storage_type(dtype);
    let fi = [f, dtype_to_storage_type(DType::I32)];
    let units = reduce::launch::units_for(target.max_units_per_cube);
    let column_lanes = (units / 32).max(1);
    let (block, tile) = (flash::launch::BLOCK, flash::launch::tile_rows(target.max_shared_memory_size, head_dim));
    let lanes = flash::launch::lanes_for(head_dim, target.plane_size, true);
    let settings = |dim: CubeDim| KernelSettings::new(*dim, ExecutionMode::Checked, AddressType::U32);
    let elementwise = settings(target.elementwise());
    let per_row = settings(CubeDim::new_1d(units as u32));
    let columns = settings(CubeDim::new_2d(32, column_lanes as u32));
    let attention = settings(CubeDim::new_1d((block * lanes) as u32));
    let gemm = settings(CubeDim::new_2d(16, 16));
    // `Kernel::new` with the launch's settings and this target's properties, then the kernel's
    // arguments in order: `T` a tensor, `S` a scalar (their compilation arguments), anything else
    // a compile-time value.
    macro_rules! build {
        ($kernel:path, $settings:expr; $($arg:tt)*) => {
            Box::new(<$kernel>::new($settings.clone(), props.clone(), runtime.clone(), $(build!(@ $arg)),*))
                as Box<dyn CubeKernel>
        };
        (@ T) => { tensor() };
        (@ S) => { () };
        (@ $value:expr) => { $value };
    }
    let out: Vec<(&str, Box<dyn CubeKernel>)> = vec![
        ("silu_mul_fwd", build!(kernels::silu_mul_fwd::SiluMulFwd, elementwise; T T T S f)),
        ("silu_mul_bwd", build!(kernels::silu_mul_bwd::SiluMulBwd, elementwise; T T T T T S f)),
        ("rope", build!(kernels::rope::Rope, elementwise; T T T T S S S f)),
        ("cross_entropy_bwd", build!(kernels::cross_entropy_bwd::CrossEntropyBwd, elementwise; T T T T T S S fi)),
        ("rms_norm_fwd (cube per row)", build!(rows::rms_norm_fwd::RmsNormFwd, per_row; T T T S S S units f)),
        ("rms_norm_bwd (cube per row)", build!(rows::rms_norm_bwd::RmsNormBwd, per_row; T T T T T S S S units f)),
        ("cross_entropy_fwd (cube per row)", build!(rows::cross_entropy_fwd::CrossEntropyFwd, per_row; T T T T S S units fi)),
        ("rms_norm_fwd (thread per row)", build!(rows_serial::rms_norm_fwd::RmsNormFwd, elementwise; T T T S S S f)),
        ("rms_norm_bwd (thread per row)", build!(rows_serial::rms_norm_bwd::RmsNormBwd, elementwise; T T T T T S S S f)),
        (
            "cross_entropy_fwd (thread per row)",
            build!(rows_serial::cross_entropy_fwd::CrossEntropyFwd, elementwise; T T T T S S fi),
        ),
        ("sum_partial (Σ x²)", build!(reduce::sum_partial::SumPartial, per_row; T T S units true f)),
        ("sum_partial (Σ x)", build!(reduce::sum_partial::SumPartial, per_row; T T S units false f)),
        ("column_sum_partial", build!(reduce::column_sum_partial::ColumnSumPartial, columns; T T S S S column_lanes f)),
        ("sum_partials", build!(reduce::sum_partials::SumPartials, per_row; T T S S f)),
        ("adamw", build!(adamw::adamw::Adamw, elementwise; T T T T T T T S S S S S S S S S f)),
        ("flash_fwd", build!(flash::flash_fwd::FlashFwd, attention; T T T T T T S S S S S head_dim tile block lanes true fi)),
        (
            "flash_bwd_dq",
            build!(flash::flash_bwd_dq::FlashBwdDq, attention; T T T T T T T T T S S S S S head_dim tile block lanes true fi),
        ),
        (
            "flash_bwd_dkv",
            build!(flash::flash_bwd_dkv::FlashBwdDkv, attention; T T T T T T T T T S S S S S head_dim tile block lanes true fi),
        ),
        (
            "grouped_gemm (rows)",
            build!(grouped::grouped_gemm::GroupedGemm, gemm; T T T T S S S S S S S S S S S S true true fi),
        ),
        (
            "grouped_gemm (weight gradient)",
            build!(grouped::grouped_gemm::GroupedGemm, gemm; T T T T S S S S S S S S S S S S false true fi),
        ),
    ];
    let ty = format!("{dtype:?}").to_lowercase();
    out.into_iter()
        .map(|(name, kernel)| OfflineKernel { name: format!("{name} [{ty}, D={head_dim}]"), kernel })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel expands for every float type and head size with the target's choices (the
    /// launches' own functions), under distinct names; the attention tile fills Hopper's shared
    /// memory up to its cap.
    #[test]
    fn every_kernel_builds_without_a_device() {
        let target = Target::hopper();
        assert_eq!(flash::launch::tile_rows(target.max_shared_memory_size, 128), 64);
        assert_eq!(flash::launch::tile_rows(48 * 1024, 128), 47);
        assert_eq!(reduce::launch::units_for(1024), 256);
        assert_eq!(reduce::launch::units_for(100), 64);
        let lanes = |d| flash::launch::lanes_for(d, 32, true);
        assert_eq!([4, 8, 12, 16, 32, 64, 128, 96].map(lanes), [1, 1, 1, 2, 4, 8, 8, 8]);
        assert_eq!(flash::launch::lanes_for(64, 4, true), 4);
        assert_eq!(flash::launch::lanes_for(64, 32, false), 1);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            for d in [64, 128] {
                let ks = kernels(&target, dtype, d);
                assert_eq!(ks.len(), 20);
                let mut names: Vec<_> = ks.iter().map(|k| k.name.clone()).collect();
                names.sort();
                names.dedup();
                assert_eq!(names.len(), ks.len(), "{names:?}");
                for k in &ks {
                    let def = k.kernel.define();
                    assert!(!def.settings.kernel_name.is_empty(), "{}", k.name);
                    let threads = def.settings.cube_dim.x * def.settings.cube_dim.y * def.settings.cube_dim.z;
                    assert!(threads > 0 && threads <= target.max_units_per_cube, "{}: {threads}", k.name);
                }
            }
        }
    }
}
