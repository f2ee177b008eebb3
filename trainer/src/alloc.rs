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

/// The system allocator, counting the bytes each thread has allocated and not freed, and that
/// count's peak: `bench checkpoint` reads a rank thread's peak during a save. Two thread-local
/// additions per call (no atomics, no locks); memory freed on another thread is subtracted
/// there, so a thread's count is what it allocated minus what it freed.
pub struct Counting;

thread_local! {
    static CURRENT: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
    static PEAK: std::cell::Cell<isize> = const { std::cell::Cell::new(0) };
}

fn count(delta: isize) {
    let _ = CURRENT.try_with(|c| {
        let now = c.get() + delta;
        c.set(now);
        let _ = PEAK.try_with(|p| p.set(p.get().max(now)));
    });
}

// SAFETY: forwards to the system allocator unchanged; the counters are plain thread-locals
// without destructors.
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        count(-(layout.size() as isize));
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        count(layout.size() as isize);
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}

/// Starts a new peak on this thread; returns the bytes it holds now.
pub fn reset_thread_peak() -> isize {
    let now = CURRENT.with(|c| c.get());
    PEAK.with(|p| p.set(now));
    now
}

/// This thread's peak since [`reset_thread_peak`].
pub fn thread_peak() -> isize {
    PEAK.with(|p| p.get())
}
