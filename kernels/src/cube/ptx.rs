//! The kernels of [`super::offline`] compiled to PTX without a GPU, through the compiler
//! cubecl-cuda itself runs on a device (its default LLVM back end: pliron, then LLVM's NVPTX),
//! for an SM architecture and the PTX version a driver loads. What a lent GPU would compile at
//! its first launch, so a kernel that does not lower shows up here and not on the GPU's clock.

use super::offline::{kernels, Target};
use burn::tensor::DType;
use cubecl::ir::nvidia::SmArch;
use cubecl::Compiler;
use cubecl_cuda::compiler::{CudaBackend, CudaCompilationOptions, CudaCompiler, CudaRepresentation};
use cubecl_llvm::nvptx::ptx_version::PtxVersion;

/// One kernel's PTX, or why it did not compile.
pub struct Ptx {
    /// The kernel, float type and head size (see [`super::offline::kernels`]).
    pub name: String,
    /// The entry point's name in the PTX.
    pub entry: String,
    /// Threads a cube (block) of its launch has.
    pub threads: u32,
    /// Shared memory a launch reserves, in bytes (cubecl-cuda passes it as dynamic shared
    /// memory, which `ptxas -v` does not count).
    pub shared_bytes: usize,
    pub ptx: Result<String, String>,
}

/// Every kernel for floats of each of `dtypes` and heads of `head_dim`, compiled for `sm_<sm>`
/// (90: Hopper) in the PTX version the CUDA driver `driver` (e.g. 12090 for 12.9) loads.
pub fn compile(target: &Target, sm: u32, driver: i32, dtypes: &[DType], head_dim: usize) -> Vec<Ptx> {
    let options = CudaCompilationOptions {
        cpp: Default::default(),
        arch: Some(SmArch::new(sm, true)),
        ptx_version: PtxVersion::for_driver(driver),
    };
    let mut out = Vec::new();
    for &dtype in dtypes {
        for k in kernels(target, dtype, head_dim) {
            let definition = k.kernel.define();
            let dim = definition.settings.cube_dim;
            let threads = dim.x * dim.y * dim.z;
            let (entry, shared_bytes, ptx) = match CudaCompiler::new(CudaBackend::Llvm).compile(definition, &options) {
                Ok(CudaRepresentation::Llvm(module)) => {
                    // NUL-terminated assembly text.
                    let bytes: Vec<u8> = module.ptx.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
                    (module.entrypoint, module.shared_memory_size, Ok(String::from_utf8_lossy(&bytes).into_owned()))
                }
                Ok(CudaRepresentation::Cpp(_)) => (String::new(), 0, Err("the LLVM back end returned CUDA C++".into())),
                Err(e) => (String::new(), 0, Err(format!("{e:?}"))),
            };
            out.push(Ptx { name: k.name, entry, threads, shared_bytes, ptx });
        }
    }
    out
}
