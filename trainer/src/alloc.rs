//! Allocator settings for the CPU training step.
//!
//! glibc's `malloc` serves blocks above 128 KiB–32 MiB (its adaptive threshold) with `mmap`
//! and returns them to the OS on `free`, and trims the heap top above 128 KiB. A training step
//! allocates and frees the same multi-megabyte activations every step, so each one was
//! page-faulted and zeroed in again. Keeping them (mmap threshold at glibc's maximum, no
//! trimming) took the debugmodel step from ≈ 1.33 s to ≈ 1.24 s on the 2-core machine.

/// glibc's largest accepted mmap threshold on 64-bit targets (`DEFAULT_MMAP_THRESHOLD_MAX`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD_MAX: libc::c_int = 32 * 1024 * 1024;

/// Applies the settings; call once at start-up, before the step's threads allocate. A no-op
/// where the C library is not glibc.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; it is called before other threads run.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX);
        libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX);
    }
}
