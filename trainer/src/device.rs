//! `training.device`: the Burn device every rank computes on.
//!
//! * `cpu` — Burn's flex backend (the fused CPU attention kernel applies).
//! * `wgpu` / `vulkan` — burn's wgpu backend (build with `--features wgpu`); `vulkan` takes
//!   Vulkan adapters only. GPUs first; where the only adapter is a software one (Mesa's
//!   llvmpipe/lavapipe), it is used with a warning — burn's own default-device logic skips those.
//! * `cuda` — build with `--features cuda` (cubecl's CUDA runtime downloads an LLVM bundle while
//!   building, so it builds only where that download works). Same CubeCL kernels as wgpu.
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
pub fn select(name: &str, index: usize) -> Result<Device> {
    let device = match name {
        "cpu" => return Ok(Device::flex()),
        "wgpu" | "vulkan" => wgpu_device(name, index)?,
        "cuda" => cuda_device(index)?,
        other => bail!("`training.device` = {other:?} is not a device; use \"cpu\", \"wgpu\", \"vulkan\" or \"cuda\""),
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

#[cfg(feature = "wgpu")]
fn wgpu_device(name: &str, index: usize) -> Result<Device> {
    use burn::tensor::DeviceKind;
    use wgpu::{Backends, DeviceType};
    let backends = if name == "vulkan" { Backends::VULKAN } else { Backends::all() };
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = backends;
    let instance = wgpu::Instance::new(desc);
    let infos: Vec<wgpu::AdapterInfo> =
        pollster::block_on(instance.enumerate_adapters(backends)).iter().map(|a| a.get_info()).collect();
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
        if index < found.len() {
            *ADAPTER.lock().unwrap_or_else(|p| p.into_inner()) = Some(found[index].name.clone());
            tracing::info!("training on {} ({kind} {index}, {:?})", found[index].name, found[index].backend);
            Ok(index)
        } else {
            bail!("`training.device_index` = {index}: there are {} {kind}(s); adapters found: {}", found.len(), list())
        }
    };
    let kind = if !of(DeviceType::DiscreteGpu).is_empty() {
        DeviceKind::DiscreteGpu(pick("discrete GPU", of(DeviceType::DiscreteGpu))?)
    } else if !of(DeviceType::IntegratedGpu).is_empty() {
        DeviceKind::IntegratedGpu(pick("integrated GPU", of(DeviceType::IntegratedGpu))?)
    } else if !of(DeviceType::VirtualGpu).is_empty() {
        DeviceKind::VirtualGpu(pick("virtual GPU", of(DeviceType::VirtualGpu))?)
    } else if !of(DeviceType::Cpu).is_empty() {
        let i = pick("software adapter", of(DeviceType::Cpu))?;
        tracing::warn!(
            "`training.device` = {name:?}: the only adapter is the software one {:?}; kernels run on the CPU through it, far slower than `cpu`",
            of(DeviceType::Cpu)[i].name
        );
        DeviceKind::Cpu
    } else {
        bail!(
            "`training.device` = {name:?}: no {} adapter found (adapters: {}); install a GPU driver, or Mesa's software Vulkan (`apt-get install mesa-vulkan-drivers libvulkan1`), or use `training.device = \"cpu\"`",
            if name == "vulkan" { "Vulkan" } else { "wgpu" },
            list()
        )
    };
    Ok(Device::wgpu(kind))
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_device(name: &str, _index: usize) -> Result<Device> {
    bail!("`training.device` = {name:?}: this titan-rs was built without GPU support; rebuild with `cargo build --release -p titan-rs --features wgpu`, or use `training.device = \"cpu\"`")
}

#[cfg(feature = "cuda")]
fn cuda_device(index: usize) -> Result<Device> {
    Ok(Device::cuda(index))
}

#[cfg(not(feature = "cuda"))]
fn cuda_device(_index: usize) -> Result<Device> {
    bail!("`training.device` = \"cuda\": this titan-rs was built without CUDA; rebuild with `--features cuda` (cubecl's CUDA runtime downloads an LLVM bundle while building), or use \"wgpu\"")
}
