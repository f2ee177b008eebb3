//! Which variant of a row reduction runs — one cube per row ([`super::rows`]) or one thread per
//! row ([`super::rows_serial`]) — measured on the real inputs the first time a kernel meets a
//! shape on a device, and cached for the process, like Burn's autotune. Under `model.attention =
//! "auto"` (the default: [`crate::choice::measuring`]) only; otherwise one cube per row, the
//! variant written for GPUs. The choice is logged once (`kernel choice: …`).

use burn_cubecl::tensor::CubeTensor;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static CHOICES: Mutex<BTreeMap<String, bool>> = Mutex::new(BTreeMap::new());
/// 0: as above; 1: always one cube per row; 2: always one thread per row.
static FORCED: AtomicU8 = AtomicU8::new(0);

/// Pins the variant for this process (`Some(true)`: one cube per row, `Some(false)`: one thread
/// per row; for tests and benchmarks), or gives the choice back (`None`).
pub fn force_row_variant(per_cube: Option<bool>) {
    FORCED.store(per_cube.map_or(0, |c| if c { 1 } else { 2 }), Ordering::Relaxed);
}

/// Whether `kernel` on `[rows, cols]` of `like`'s type and device runs one cube per row;
/// measuring calls `run(per_cube)` (one launch of that variant on the real inputs) once each to
/// compile, then three times each, alternated, every launch timed between device syncs.
pub(super) fn per_cube(kernel: &str, like: &CubeTensor, rows: usize, cols: usize, run: impl Fn(bool)) -> bool {
    match FORCED.load(Ordering::Relaxed) {
        1 => return true,
        2 => return false,
        _ if !crate::choice::measuring() => return true,
        _ => {}
    }
    let key = format!("{kernel} [{rows}, {cols}] {:?} on {:?}", like.dtype, like.device);
    // Held while measuring: ranks sharing a device measure one after another.
    let mut cache = CHOICES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&c) = cache.get(&key) {
        return c;
    }
    let sync = || {
        let _ = cubecl::future::block_on(like.client.sync());
    };
    let (cube, thread) = crate::choice::medians(|per_cube| {
        sync();
        let t = Instant::now();
        run(per_cube);
        sync();
        t.elapsed().as_secs_f64()
    });
    let choice = cube <= thread;
    tracing::info!(
        "kernel choice: {key}: one cube per row {:.3} ms, one thread per row {:.3} ms (median of 3) → {}",
        cube * 1e3,
        thread * 1e3,
        if choice { "one cube per row" } else { "one thread per row" }
    );
    cache.insert(key, choice);
    choice
}
