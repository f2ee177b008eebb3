//! Vectorisable scalar helpers of the host kernels: fixed-order (deterministic) reductions
//! with 8 lanes and a branch-free `exp`.

use rayon::prelude::*;

/// Elements per parallel task of the one-pass host kernels.
pub(crate) const CHUNK: usize = 16 * 1024;

/// `Σ a·b` with 8 independent accumulators.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// `Σ a` in a fixed order with 8 lanes (vectorises; deterministic).
#[inline]
pub fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let c = a.chunks_exact(8);
    let r = c.remainder();
    for x in c {
        for l in 0..8 {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + r.iter().sum::<f32>()
}

/// `max a` (−∞ for an empty slice) with 16 independent lanes, so it vectorises (a plain fold
/// of `f32::max` is a serial chain).
#[inline]
pub fn max(a: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let c = a.chunks_exact(16);
    let r = c.remainder();
    for x in c {
        for l in 0..16 {
            acc[l] = acc[l].max(x[l]);
        }
    }
    acc.iter().chain(r).fold(f32::NEG_INFINITY, |m, &x| m.max(x))
}

/// `e^x` for `x <= 0` to ~1e-7 relative (Cephes' expf polynomial), branch-free so the loop
/// over a row vectorises; libm's `expf` per element was a third of the kernel's time.
#[inline]
pub fn exp_nonpositive(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const ROUND: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer
    let x = x.max(-87.0);
    // z = ROUND + round(x · log2e): its low mantissa bits hold n = round(x · log2e).
    let z = x * LOG2E + ROUND;
    let n = z - ROUND;
    let r = x - n * 0.693_359_4 + n * 2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 5.000_000_1e-1;
    let y = p * r * r + r + 1.0;
    // 2ⁿ from z's bits (no float → int conversion, whose saturation does not vectorise).
    let pow2n = f32::from_bits(z.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    pow2n * y
}

/// Runs `f` compiled for AVX-512 (or AVX2 + FMA) where the CPU has it, else as built. The
/// crate targets the x86-64 baseline, where the kernels' loops vectorise only with 4-wide SSE;
/// `f` should be an `#[inline(always)]` closure so that its body is compiled inside the
/// feature-enabled function. Results are the same either way: the reductions fix their order
/// with explicit lanes and Rust never contracts `a·b + c` into an FMA.
#[inline(always)]
pub fn simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { x86::avx512(f) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            return unsafe { x86::avx2(f) };
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

/// The logistic function `1 / (1 + e^−x)`, through [`exp_nonpositive`] of `−|x|`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    let e = exp_nonpositive(-x.abs());
    let r = 1.0 / (1.0 + e);
    if x >= 0.0 {
        r
    } else {
        e * r
    }
}

/// `Σ x²` in f64, one read of `x`: fixed chunks summed in parallel, the chunk sums added in
/// order, so the result does not depend on the thread count (the gradient norm's squares).
pub fn sum_squares(x: &[f32]) -> f64 {
    let parts: Vec<f64> = x
        .par_chunks(CHUNK)
        .map(|c| {
            simd(
                #[inline(always)]
                || c.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>(),
            )
        })
        .collect();
    parts.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate_on_the_softmax_range() {
        let mut worst = 0f64;
        for k in 0..=200_000 {
            let x = -(k as f32) * 100.0 / 200_000.0;
            let (a, b) = (exp_nonpositive(x) as f64, (x as f64).exp());
            if b > 1e-30 {
                worst = worst.max((a - b).abs() / b);
            }
        }
        assert!(worst < 5e-7, "relative error {worst}");
    }

    #[test]
    fn sigmoid_is_accurate_for_both_signs() {
        let mut worst = 0f64;
        for k in -100_000..=100_000 {
            let x = k as f32 * 3e-4; // −30 … 30
            let exact = 1.0 / (1.0 + (-(x as f64)).exp());
            worst = worst.max((sigmoid(x) as f64 - exact).abs() / exact);
        }
        assert!(worst < 1e-6, "relative error {worst}");
    }
}
