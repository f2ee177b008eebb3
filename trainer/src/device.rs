//! `training.device`: the Burn device every rank computes on.
//!
//! * `cpu` — Burn's flex backend (the fused CPU attention kernel applies).
//! * `wgpu` / `vulkan` — burn's wgpu backend (build with `--features wgpu`); `vulkan` takes
//!   Vulkan adapters only. GPUs first; where the only adapter is a software one (Mesa's
//!   llvmpipe/lavapipe), it is used with a warning — burn's own default-device logic skips those.
//! * `cuda` — build with `--features cuda` after `scripts/gpu/cuda_llvm.sh` (cubecl's CUDA
//!   runtime compiles kernels through LLVM 23.1's NVPTX back end, which its build would otherwise
//!   download). Same CubeCL kernels as wgpu.
//!
//! A device that is asked for and missing is an error that lists what there is.

use anyhow::{bail, Result};
use burn::prelude::*;
use std::sync::Mutex;

/// The name of the GPU adapter [`select`] picked last (for the MFU peak table and reports).
static ADAPTER: Mutex<Option<String>> = Mutex::new(None);

/// The adapter [`select`] picked for a GPU device (`None` on the CPU).
pub fn selected_adapter() -> Option<String> {
    ADAPTER.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The device for `training.device` / `training.device_index`, checked with a real reduction.
/// `index` `None` (-1): one GPU per rank — the rank with `local_rank` on its host takes adapter
/// `local_rank mod adapters` of the chosen kind.
pub fn select(kind: crate::config::DeviceKind, index: Option<usize>, local_rank: usize) -> Result<Device> {
    use crate::config::DeviceKind as Kind;
    let name = kind.as_str();
    let device = match kind {
        Kind::Cpu => return Ok(Device::flex()),
        Kind::Wgpu | Kind::Vulkan => wgpu_device(name, index, local_rank)?,
        Kind::Cuda => cuda_device(index.unwrap_or(local_rank))?,
    };
    check(&device, name)?;
    Ok(device)
}

/// Runs a sum on `device`: a misconfigured driver (e.g. a wrong `VK_ICD_FILENAMES` falling back
/// to a GL software driver) fails here instead of mid-step.
fn check(device: &Device, name: &str) -> Result<()> {
    let d = device.clone();
    let got = std::panic::catch_unwind(move || Tensor::<1>::ones([64], &d).sum().into_scalar::<f32>());
    match got {
        Ok(v) if v == 64.0 => Ok(()),
        Ok(v) => bail!("`training.device` = {name:?}: a test sum of 64 ones gave {v}; the driver is broken"),
        Err(_) => bail!("`training.device` = {name:?}: the device failed its first operation (see the panic above); check the GPU/Vulkan driver, or use `training.device = \"cpu\"`"),
    }
}

/// One GPU adapter as `titan-rs devices` reports it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Adapter {
    pub name: String,
    /// discrete GPU, integrated GPU, virtual GPU, software adapter, other
    pub kind: String,
    /// Its index among the adapters of its kind (`training.device_index`).
    pub index: usize,
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
    pub vendor: u32,
    /// What `training.device = "wgpu"` with `device_index = 0` trains on: the first discrete
    /// GPU, else integrated, virtual, then software.
    pub chosen: bool,
    /// Whether the device computes in these types (`training.mixed_precision_param`).
    pub float16: bool,
    pub bfloat16: bool,
}

/// The wgpu adapters (empty without the `wgpu` feature), in the order [`select`] prefers their
/// kinds: discrete GPUs first (a real NVIDIA card before Mesa's llvmpipe/lavapipe).
pub fn adapters() -> Vec<Adapter> {
    #[cfg(feature = "wgpu")]
    {
        use burn::tensor::DType;
        let infos = enumerate("wgpu");
        let mut out = Vec::new();
        for (kind, t) in &KINDS {
            for (index, i) in infos.iter().filter(|i| i.device_type == *t).enumerate() {
                let device = Device::wgpu(device_kind(*t, index));
                let supports = |d: DType| std::panic::catch_unwind(|| device.supports_dtype(d)).unwrap_or(false);
                out.push(Adapter {
                    name: i.name.clone(),
                    kind: kind.to_string(),
                    index,
                    backend: format!("{:?}", i.backend),
                    driver: i.driver.clone(),
                    driver_info: i.driver_info.clone(),
                    vendor: i.vendor,
                    chosen: out.is_empty(),
                    float16: supports(DType::F16),
                    bfloat16: supports(DType::BF16),
                });
            }
        }
        out
    }
    #[cfg(not(feature = "wgpu"))]
    Vec::new()
}

/// Adapter kinds in the order they are preferred.
#[cfg(feature = "wgpu")]
const KINDS: [(&str, wgpu::DeviceType); 4] = [
    ("discrete GPU", wgpu::DeviceType::DiscreteGpu),
    ("integrated GPU", wgpu::DeviceType::IntegratedGpu),
    ("virtual GPU", wgpu::DeviceType::VirtualGpu),
    ("software adapter", wgpu::DeviceType::Cpu),
];

#[cfg(feature = "wgpu")]
fn device_kind(t: wgpu::DeviceType, index: usize) -> burn::tensor::DeviceKind {
    use burn::tensor::DeviceKind;
    match t {
        wgpu::DeviceType::DiscreteGpu => DeviceKind::DiscreteGpu(index),
        wgpu::DeviceType::IntegratedGpu => DeviceKind::IntegratedGpu(index),
        wgpu::DeviceType::VirtualGpu => DeviceKind::VirtualGpu(index),
        _ => DeviceKind::Cpu,
    }
}

/// The adapters wgpu sees for `training.device = name` (`vulkan`: Vulkan ones only).
#[cfg(feature = "wgpu")]
fn enumerate(name: &str) -> Vec<wgpu::AdapterInfo> {
    use wgpu::Backends;
    let backends = if name == "vulkan" { Backends::VULKAN } else { Backends::all() };
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    let instance = wgpu::Instance::new(desc);
    pollster::block_on(instance.enumerate_adapters(backends)).iter().map(|a| a.get_info()).collect()
}

#[cfg(feature = "wgpu")]
fn wgpu_device(name: &str, index: Option<usize>, local_rank: usize) -> Result<Device> {
    use wgpu::DeviceType;
    let infos = enumerate(name);
    let of = |t: DeviceType| infos.iter().filter(|i| i.device_type == t).collect::<Vec<_>>();
    let list = || {
        if infos.is_empty() {
            "none".to_string()
        } else {
            infos
                .iter()
                .map(|i| format!("{} ({:?}, {:?})", i.name, i.device_type, i.backend))
                .collect::<Vec<_>>()
                .join("; ")
        }
    };
    let pick = |kind: &str, found: Vec<&wgpu::AdapterInfo>| -> Result<usize> {
        let index = index.unwrap_or(local_rank % found.len().max(1));
        if index < found.len() {
            *ADAPTER.lock().unwrap_or_else(|p| p.into_inner()) = Some(found[index].name.clone());
            tracing::info!(
                "local rank {local_rank}: training on {} ({kind} {index} of {}, {:?})",
                found[index].name,
                found.len(),
                found[index].backend
            );
            Ok(index)
        } else {
            bail!("`training.device_index` = {index}: there are {} {kind}(s); adapters found: {}", found.len(), list())
        }
    };
    let Some((kind, t)) = KINDS.iter().find(|(_, t)| !of(*t).is_empty()) else {
        bail!(
            "`training.device` = {name:?}: no {} adapter found (adapters: {}); install a GPU driver, or Mesa's software Vulkan (`apt-get install mesa-vulkan-drivers libvulkan1`), or use `training.device = \"cpu\"`",
            if name == "vulkan" { "Vulkan" } else { "wgpu" },
            list()
        )
    };
    let i = pick(kind, of(*t))?;
    if *t == DeviceType::Cpu {
        tracing::warn!(
            "`training.device` = {name:?}: the only adapter is the software one {:?}; kernels run on the CPU through it, far slower than `cpu`",
            of(*t)[i].name
        );
    }
    Ok(Device::wgpu(device_kind(*t, i)))
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_device(name: &str, _index: Option<usize>, _local_rank: usize) -> Result<Device> {
    bail!("`training.device` = {name:?}: this titan-rs was built without GPU support; rebuild with `cargo build --release -p titan-rs --features wgpu`, or use `training.device = \"cpu\"`")
}

/// CUDA GPU `index`; its name (from `nvidia-smi`, when there) names the adapter for the MFU
/// peak table, as wgpu's adapter name does.
#[cfg(feature = "cuda")]
fn cuda_device(index: usize) -> Result<Device> {
    // cubecl-cuda loads the driver on its device thread and panics there when it is missing:
    // look first, and say so plainly.
    // SAFETY: dlopen/dlclose of the driver library by a NUL-terminated name; nothing is called.
    let driver = unsafe {
        let h = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if !h.is_null() {
            libc::dlclose(h);
        }
        !h.is_null()
    };
    if !driver {
        bail!("`training.device` = \"cuda\": no NVIDIA driver here (libcuda.so.1 cannot be loaded); install the driver or add its folder to LD_LIBRARY_PATH, or use \"wgpu\" / \"cpu\"");
    }
    let name = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader", &format!("--id={index}")])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|n| !n.is_empty());
    *ADAPTER.lock().unwrap_or_else(|p| p.into_inner()) = name;
    Ok(Device::cuda(index))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_index: usize) -> Result<Device> {
    bail!("`training.device` = \"cuda\": this titan-rs was built without CUDA; rebuild with `--features cuda` after `scripts/gpu/cuda_llvm.sh` (installs the LLVM 23.1 its build needs, from PyPI), or use \"wgpu\"")
}
