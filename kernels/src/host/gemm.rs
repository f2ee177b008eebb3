//! Matrix products on strided `f32` views through the `gemm` crate (the GEMM flex itself uses;
//! AVX-512 kernels where the CPU has them).
//!
//! * [`matmul`]: one thread — the attention's tile products, each task on its own thread.
//! * [`par_matmul`]: the whole product split into one output panel per rayon thread, each panel
//!   a single-threaded GEMM. On the 2-core machine this reaches PyTorch's (MKL) GEMM speed at the
//!   model's shapes, where `gemm`'s own `Parallelism::Rayon` (what flex's matmul uses) loses up
//!   to half of it on the weight-gradient shapes (`[256, 2048] · [2048, 768]`: ≈ 125 vs ≈ 230
//!   GFLOP/s).

use rayon::prelude::*;

/// A read-only matrix: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

impl<'a> View<'a> {
    /// `rows × cols` row-major, starting at `data[0]`.
    pub fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self { data, rows, cols, rs: cols, cs: 1 }
    }

    /// `rows × cols` with element `(i, j)` at `data[i * rs + j * cs]`; `None` when that reaches
    /// past `data`.
    pub fn strided(data: &'a [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Option<Self> {
        let v = Self { data, rows, cols, rs, cs };
        v.in_bounds().then_some(v)
    }

    pub fn dims(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }

    /// Rows `r` (no copy).
    fn row_range(self, r: std::ops::Range<usize>) -> Self {
        assert!(r.start <= r.end && r.end <= self.rows);
        let data = if r.is_empty() { &self.data[..0] } else { &self.data[r.start * self.rs..] };
        Self { data, rows: r.len(), ..self }
    }

    fn in_bounds(&self) -> bool {
        self.rows == 0 || self.cols == 0 || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// `c = a · b` (or `c += a · b` with `accumulate`), `c` row-major `a.rows × b.cols` with row
/// stride `ldc`. One thread.
pub fn matmul(c: &mut [f32], ldc: usize, accumulate: bool, a: View, b: View) {
    let (m, n) = check(c.len(), ldc, &a, &b);
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: `check` bounds-checked every index against the slices, borrowed for the call (`c`
    // mutably and exclusively).
    unsafe { gemm_raw(c.as_mut_ptr(), ldc, accumulate, a, b) }
}

/// `c = a · b` into uninitialised memory: `c` is exactly the row-major `a.rows × b.cols`
/// product, and every element is written (zeros when the inner dimension is 0). One thread.
pub fn matmul_into(c: &mut [std::mem::MaybeUninit<f32>], a: View, b: View) {
    let (m, n) = check(c.len(), b.cols, &a, &b);
    assert_eq!(c.len(), m * n, "matmul_into: the output must be exactly the product");
    if m == 0 || n == 0 {
        return;
    }
    // SAFETY: `check` bounds-checked the views and the output; without accumulation the
    // output is only written (f32 has no invalid bit patterns), every element of it.
    unsafe { gemm_raw(c.as_mut_ptr().cast::<f32>(), n, false, a, b) }
}

/// `a · b`, row-major `a.rows × b.cols`, split over the rayon threads: one panel of columns
/// per thread (of rows when the product is narrow), each a single-threaded GEMM. Every output
/// element is computed by one thread.
pub fn par_product(a: View, b: View) -> Vec<f32> {
    let (m, n) = (a.rows, b.cols);
    let mut c = Vec::with_capacity(m * n);
    check(m * n, n, &a, &b);
    let work = m * n * a.cols;
    let threads = rayon::current_num_threads().min(work / MIN_PANEL_WORK).max(1);
    let out = Ptr(c.as_mut_ptr());
    // Panels of whole 16-column vectors (AVX-512), or rows when there are too few columns.
    let by_cols = n >= threads * 64;
    let len = if by_cols { n } else { m };
    let step = len.div_ceil(threads).next_multiple_of(if by_cols { 16 } else { 1 }).max(1);
    (0..len.div_ceil(step)).into_par_iter().for_each(|p| {
        let r = p * step..((p + 1) * step).min(len);
        let out = out;
        // SAFETY: the panels are disjoint parts of `c`'s allocation (checked whole above), each
        // written (never read: no accumulation) by exactly one task.
        unsafe {
            if by_cols {
                gemm_raw(out.0.add(r.start), n, false, a, b.t().row_range(r).t());
            } else {
                gemm_raw(out.0.add(r.start * n), n, false, a.row_range(r), b);
            }
        }
    });
    // SAFETY: the panels cover all `m × n` elements, each written above.
    unsafe { c.set_len(m * n) };
    c
}

/// Below this many multiply-adds per panel, splitting costs more than it saves.
const MIN_PANEL_WORK: usize = 64 * 64 * 64;

#[derive(Clone, Copy)]
struct Ptr(*mut f32);
// SAFETY: used only to hand disjoint output panels to rayon tasks (see `par_matmul`).
unsafe impl Send for Ptr {}
unsafe impl Sync for Ptr {}

/// Checks the operands and an output of `len` elements with row stride `ldc`; `(m, n)`.
fn check(len: usize, ldc: usize, a: &View, b: &View) -> (usize, usize) {
    assert_eq!(a.cols, b.rows, "matmul: inner dimensions differ");
    assert!(a.in_bounds() && b.in_bounds(), "matmul: view out of bounds");
    let (m, n) = (a.rows, b.cols);
    assert!(m == 0 || n == 0 || (ldc >= n && (m - 1) * ldc + n <= len), "matmul: output too small");
    (m, n)
}

/// # Safety
/// `c` must be valid for writes (and reads with `accumulate`) of the `a.rows × b.cols` matrix
/// with row stride `ldc`, not accessed by anyone else during the call; `a`, `b` in bounds.
unsafe fn gemm_raw(c: *mut f32, ldc: usize, accumulate: bool, a: View, b: View) {
    let (m, n, k) = (a.rows, b.cols, a.cols);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                std::ptr::write_bytes(c.add(i * ldc), 0, n);
            }
        }
        return;
    }
    gemm::gemm(
        m,
        n,
        k,
        c,
        1,
        ldc as isize,
        accumulate,
        a.data.as_ptr(),
        a.cs as isize,
        a.rs as isize,
        b.data.as_ptr(),
        b.cs as isize,
        b.rs as isize,
        1.0,
        1.0,
        false,
        false,
        false,
        gemm::Parallelism::None,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every shape from 1 to 9 in each dimension, plain and transposed operands, set and
    /// accumulate, against the three-loop product.
    #[test]
    fn matches_the_naive_product() {
        let val = |i: usize| ((i * 7919 % 113) as f32 - 56.0) / 17.0;
        for (m, n, k) in (1..10).flat_map(|m| (1..10).flat_map(move |n| (1..10).map(move |k| (m, n, k)))) {
            let (a, b): (Vec<f32>, Vec<f32>) =
                ((0..m * k).map(val).collect(), (0..k * n).map(|i| val(i + 5)).collect());
            for (ta, tb, acc) in [(false, false, false), (true, false, true), (false, true, true), (true, true, false)]
            {
                let av = if ta { View::rows(&a, k, m).t() } else { View::rows(&a, m, k) };
                let bv = if tb { View::rows(&b, n, k).t() } else { View::rows(&b, k, n) };
                let at = |i: usize, j: usize| if ta { a[j * m + i] } else { a[i * k + j] };
                let bt = |i: usize, j: usize| if tb { b[j * k + i] } else { b[i * n + j] };
                let mut c = vec![1.5f32; m * n];
                matmul(&mut c, n, acc, av, bv);
                for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
                    let want = (0..k).map(|l| at(i, l) * bt(l, j)).sum::<f32>() + if acc { 1.5 } else { 0.0 };
                    let got = c[i * n + j];
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{m}x{n}x{k} {ta} {tb} {acc}: {got} vs {want}"
                    );
                }
            }
        }
    }

    /// The threaded product against the naive one: column panels, row panels (narrow
    /// products), one panel (small work), empty and `k = 0` products, transposed operands.
    #[test]
    fn par_product_matches_the_naive_product() {
        let val = |i: usize| ((i * 7919 % 113) as f32 - 56.0) / 17.0;
        for (m, n, k) in
            [(0, 5, 3), (4, 0, 3), (3, 4, 0), (1, 1, 1), (5, 7, 3), (70, 300, 65), (300, 40, 70), (33, 1000, 129)]
        {
            let (a, b): (Vec<f32>, Vec<f32>) =
                ((0..m * k).map(val).collect(), (0..k * n).map(|i| val(i + 5)).collect());
            for (ta, tb) in [(false, false), (true, true), (false, true)] {
                let av = if ta { View::rows(&a, k, m).t() } else { View::rows(&a, m, k) };
                let bv = if tb { View::rows(&b, n, k).t() } else { View::rows(&b, k, n) };
                let at = |i: usize, j: usize| if ta { a[j * m + i] } else { a[i * k + j] };
                let bt = |i: usize, j: usize| if tb { b[j * k + i] } else { b[i * n + j] };
                let c = par_product(av, bv);
                assert_eq!(c.len(), m * n);
                for (i, j) in (0..m).flat_map(|i| (0..n).map(move |j| (i, j))) {
                    let want = (0..k).map(|l| at(i, l) * bt(l, j)).sum::<f32>();
                    let got = c[i * n + j];
                    assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{m}x{n}x{k} {ta} {tb}: {got} vs {want}");
                }
            }
        }
    }
}
