//! A sharded module computes what the unsharded one does: same loss, and each rank's gradient is
//! its rows of the full gradient (uneven rows padded with zeros), on 1–4 ranks.

use super::*;
use crate::launcher::run_ranks;
use crate::registry::register;
use burn::module::ParamId;
use burn::optim::GradientsParams;
use std::time::Duration;

#[derive(Module, Debug)]
struct Tiny {
    /// 5 rows: uneven on 2, 3 and 4 ranks.
    w: Param<Tensor<2>>,
    /// 3 rows: fewer rows than ranks on 4 ranks (one shard is all padding).
    g: Param<Tensor<1>>,
}

fn vals(n: usize, tag: usize) -> Vec<f32> {
    (0..n).map(|i| (((tag * 7919 + i * 104_729) % 2003) as f32) / 1000.0 - 1.0).collect()
}

fn tiny(device: &Device) -> Tiny {
    let w = Tensor::<2>::from_data(TensorData::new(vals(15, 1), [5, 3]), device).require_grad();
    let g = Tensor::<1>::from_data(TensorData::new(vals(3, 2), [3]), device).require_grad();
    Tiny { w: Param::initialized(ParamId::from(1), w), g: Param::initialized(ParamId::from(2), g) }
}

/// loss = sum(tanh(x · w) · g) for rank `r`'s input x `[4, 5]`.
fn loss(m: &Tiny, r: usize, device: &Device) -> Tensor<1> {
    let x = Tensor::<2>::from_data(TensorData::new(vals(20, 3 + r), [4, 5]), device);
    (x.matmul(m.w.val()).tanh() * m.g.val().unsqueeze::<2>()).sum()
}

fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_into_vec::<f32>().unwrap()
}

#[test]
fn sharded_forward_and_gradients_equal_the_unsharded_ones() {
    for n in 1..=4 {
        // The reference: one rank, the sum of every rank's loss (as data parallelism computes).
        let device = Device::flex().autodiff();
        let m = tiny(&device);
        let (mut total, mut want_losses) = (None::<Tensor<1>>, Vec::new());
        for r in 0..n {
            let l = loss(&m, r, &device);
            want_losses.push(host(l.clone())[0]);
            total = Some(match total {
                Some(t) => t + l,
                None => l,
            });
        }
        let grads = GradientsParams::from_grads(total.unwrap().backward(), &m);
        let want_w = host(grads.get::<2>(m.w.id).unwrap());
        let want_g = host(grads.get::<1>(m.g.id).unwrap());

        run_ranks(n, Duration::from_secs(30), |c| {
            let device = Device::flex().autodiff();
            let r = c.rank();
            let want_loss = want_losses[r];
            let group = register(Box::new(c));
            let (m, sharding) = fully_shard(tiny(&device), &group, false);
            let (lw, lg) = (sharding.layout("w").unwrap(), sharding.layout("g").unwrap());
            assert_eq!(m.w.base().dims(), [5usize.div_ceil(n), 3]);
            assert_eq!(m.g.base().dims(), [3usize.div_ceil(n)]);
            // The full values come back on read.
            assert_eq!(host(m.w.val()), vals(15, 1));
            let l = loss(&m, r, &device);
            assert!((host(l.clone())[0] - want_loss).abs() <= 1e-5 * want_loss.abs().max(1.0));
            let grads = GradientsParams::from_grads(l.backward(), &m);
            let (gw, gg) = (host(grads.get::<2>(m.w.id).unwrap()), host(grads.get::<1>(m.g.id).unwrap()));
            let (sw, _) = lw.shard(&want_w, &[5, 3]);
            let (sg, _) = lg.shard(&want_g, &[3]);
            for (got, want) in [(gw, sw), (gg, sg)] {
                assert_eq!(got.len(), want.len());
                for (a, b) in got.iter().zip(&want) {
                    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{n} ranks: {a} vs {b}");
                }
            }
            // Gathering the shards gives back the full tensor.
            crate::registry::with_group(group.id(), |c| {
                assert_eq!(lw.unshard(&host(m.w.base()), c).unwrap(), vals(15, 1));
            });
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

#[test]
fn layouts_pad_the_last_shards() {
    let l = ShardLayout::new(5, 4, 3);
    assert_eq!(l.chunk, 2);
    let (s, shape) = l.shard(&[0., 1., 2., 3., 4.], &[5]);
    assert_eq!((s, shape), (vec![0., 0.], vec![2]));
    let (s, _) = ShardLayout::new(5, 4, 2).shard(&[0., 1., 2., 3., 4.], &[5]);
    assert_eq!(s, vec![4., 0.]);
}
