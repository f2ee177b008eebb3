//! The Newton–Schulz orthogonalisation of Muon (Keller Jordan's quintic iteration): `X ← a·X +
//! (b·A + c·A²)·X` with `A = X·Xᵀ`, five times, after dividing `X` by its Frobenius norm; it
//! drives every singular value of the update towards 1 (≈ U·Vᵀ of its SVD). Batched over the
//! leading dimension (stacked experts: one matrix each), on the device's matmul (the threaded
//! GEMM on the CPU), in float32 (PyTorch's `torch.optim.Muon` runs it in bfloat16).

use burn::prelude::*;

/// Muon's iteration settings and its learning-rate adjustment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NewtonSchulz {
    pub coefficients: [f32; 3],
    pub steps: usize,
    pub eps: f32,
}

impl NewtonSchulz {
    /// `g` (`[batch, rows, cols]`) with each matrix orthogonalised.
    pub fn orthogonalise(&self, g: Tensor<3>) -> Tensor<3> {
        let [_, rows, cols] = g.dims();
        let [a, b, c] = self.coefficients;
        // Iterate on the wide orientation: the Gram matrix is the smaller square.
        let tall = rows > cols;
        let mut x = if tall { g.swap_dims(1, 2) } else { g };
        let norm = (x.clone() * x.clone()).sum_dim(2).sum_dim(1).sqrt().clamp_min(self.eps);
        x = x / norm;
        for _ in 0..self.steps {
            let gram = x.clone().matmul(x.clone().swap_dims(1, 2));
            let poly = gram.clone().mul_scalar(b) + gram.clone().matmul(gram).mul_scalar(c);
            x = x.clone().mul_scalar(a) + poly.matmul(x);
        }
        if tall {
            x.swap_dims(1, 2)
        } else {
            x
        }
    }
}

/// `[batch, rows, cols]` of a parameter shape: a matrix is one batch, stacked experts `[E, r, c]`
/// are `E`.
pub fn batched(shape: &[usize]) -> [usize; 3] {
    match *shape {
        [r, c] => [1, r, c],
        [e, r, c] => [e, r, c],
        _ => panic!("Muon takes matrices, not a tensor of shape {shape:?}"),
    }
}
