//! `titan-rs ptx`: every CubeCL kernel compiled to PTX without a GPU (`titan_kernels::cube::ptx`),
//! written one file per kernel with an index, so NVIDIA's `ptxas` can assemble them here for the
//! registers, spills and shared memory a lent GPU would see (`scripts/gpu/ptx_report.py`).

use anyhow::Result;
use std::path::Path;

/// Compiles every kernel for float32 and bfloat16 and each of `head_dims` for `sm_<sm>` and
/// writes `out/<entry>.ptx` and `out/kernels.tsv` (kernel, entry point, threads a block, shared memory, file, `ok` or the
/// error);
/// `(compiled, total)`.
#[cfg(feature = "cuda")]
pub fn write(out: &Path, sm: u32, driver: i32, head_dims: &[usize]) -> Result<(usize, usize)> {
    use anyhow::Context;
    use burn::tensor::DType;
    use titan_kernels::cube::{offline::Target, ptx};
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut index = String::from("kernel\tentry\tthreads\tshared_bytes\tfile\tstatus\n");
    let (mut ok, mut total) = (0, 0);
    let mut seen = std::collections::BTreeSet::new();
    for &d in head_dims {
        for k in ptx::compile(&Target::hopper(), sm, driver, &[DType::F32, DType::BF16], d) {
            // Kernels without a head size come out the same for every head size: once.
            let key = match &k.ptx {
                Ok(text) => (k.entry.clone(), text.clone()),
                Err(e) => (k.name.split(", D=").next().unwrap_or_default().to_string(), e.clone()),
            };
            if !seen.insert(key) {
                continue;
            }
            total += 1;
            let (file, status) = match &k.ptx {
                Ok(text) => {
                    let file = format!("{:03}_{}.ptx", total, k.entry);
                    let path = out.join(&file);
                    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
                    ok += 1;
                    (file, "ok".to_string())
                }
                Err(e) => (String::new(), e.replace(['\t', '\n'], " ")),
            };
            index.push_str(&format!("{}\t{}\t{}\t{}\t{file}\t{status}\n", k.name, k.entry, k.threads, k.shared_bytes));
        }
    }
    let path = out.join("kernels.tsv");
    std::fs::write(&path, index).with_context(|| format!("writing {}", path.display()))?;
    Ok((ok, total))
}

/// Without CUDA: an error naming the build that has it.
#[cfg(not(feature = "cuda"))]
pub fn write(_out: &Path, _sm: u32, _driver: i32, _head_dims: &[usize]) -> Result<(usize, usize)> {
    anyhow::bail!(
        "`titan-rs ptx` compiles through burn's CUDA backend: build titan-rs with `--features cuda` \
         (scripts/gpu/cuda_llvm.sh installs the LLVM it needs; scripts/gpu/package.sh --cuda builds it)"
    )
}
