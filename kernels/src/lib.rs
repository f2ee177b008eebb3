//! Fused kernels for titan-rs, each a Burn custom op with forward and backward, used by the
//! model where the device supports it; the composed Burn ops stay the reference path.
//!
//! * [`attention`]: causal (GQA-aware) attention that never stores the `T × T` probabilities:
//!   forward keeps the output and the per-row log-sum-exp, backward recomputes the
//!   probabilities row by row. CPU (flex) implementation in Rust, multithreaded with rayon.

pub mod attention;

pub use attention::{causal_attention, supports_fused_attention};
