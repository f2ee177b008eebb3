//! One parameter's gradient summed on the host in the order the trainer's accumulation sums it
//! on the device: the gradients of one backward pass summed first, then that sum added to what
//! the earlier passes accumulated. The overlapped replica all-reduces (DDP's, HSDP's) reduce
//! these sums, so they equal the synchronous path's bit for bit.

/// The accumulated sum of the closed passes and the open pass's sum, by pass (epoch).
#[derive(Default, Debug)]
pub(crate) struct PassSum {
    total: Option<Vec<f32>>,
    open: Option<(usize, Vec<f32>)>,
}

fn add(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
}

impl PassSum {
    /// Starts from what earlier passes accumulated (on the device, read back).
    pub fn from_total(total: Option<Vec<f32>>) -> Self {
        Self { total, open: None }
    }

    /// A gradient of backward pass `epoch` (passes arrive in order).
    pub fn add(&mut self, epoch: usize, g: Vec<f32>) {
        match &mut self.open {
            Some((e, s)) if *e == epoch => add(s, &g),
            _ => {
                self.close_open();
                self.open = Some((epoch, g));
            }
        }
    }

    fn close_open(&mut self) {
        if let Some((_, s)) = self.open.take() {
            match &mut self.total {
                Some(t) => add(t, &s),
                None => self.total = Some(s),
            }
        }
    }

    /// The whole sum (`None`: nothing arrived), leaving `self` empty.
    pub fn take(&mut self) -> Option<Vec<f32>> {
        self.close_open();
        self.total.take()
    }

    /// The whole sum so far, leaving `self` as it is (more may still arrive).
    pub fn snapshot(&self) -> Option<Vec<f32>> {
        let mut total = self.total.clone();
        if let Some((_, s)) = &self.open {
            match &mut total {
                Some(t) => add(t, s),
                None => total = Some(s.clone()),
            }
        }
        total
    }
}
