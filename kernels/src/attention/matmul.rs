//! Small single-threaded matrix products on strided `f32` views, through the `gemm` crate (the
//! GEMM flex itself uses; AVX-512 kernels where the CPU has them). Each attention task runs its
//! tiles on one thread, so the products never nest a parallel region.

/// A read-only matrix: element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub(super) struct View<'a> {
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

    /// The transpose (no copy).
    pub fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, rs: self.cs, cs: self.rs, ..self }
    }

    fn check(&self) {
        if self.rows > 0 && self.cols > 0 {
            let last = (self.rows - 1) * self.rs + (self.cols - 1) * self.cs;
            assert!(last < self.data.len(), "matrix view out of bounds: {last} >= {}", self.data.len());
        }
    }
}

/// `c = a · b` (or `c += a · b` with `accumulate`), `c` row-major `a.rows × b.cols` with row
/// stride `ldc`.
pub(super) fn matmul(c: &mut [f32], ldc: usize, accumulate: bool, a: View, b: View) {
    assert_eq!(a.cols, b.rows, "matmul: inner dimensions differ");
    let (m, n, k) = (a.rows, b.cols, a.cols);
    if m == 0 || n == 0 {
        return;
    }
    a.check();
    b.check();
    assert!(ldc >= n && (m - 1) * ldc + n <= c.len(), "matmul: output too small");
    // SAFETY: every index the product touches was bounds-checked above against the slices, which
    // are borrowed for the call (`c` mutably and exclusively).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
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
}
