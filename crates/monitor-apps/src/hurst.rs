//! Real-time estimation of the Hurst parameter (Roughan, Veitch and Abry,
//! "Real-time estimation of the parameters of long-range dependence",
//! IEEE/ACM ToN 8(4), 2000; FLAME §3.1).
//!
//! The *fast part* ([`App::packet`]) only counts packets per interval of
//! `bin_ns` and queues each finished interval's count in a ring of [`RING`]
//! counts. The *periodic part* ([`App::tick`]) drains the ring into an online
//! Haar wavelet pyramid — each new count updates at most one coefficient per
//! octave, so the work is O(1) amortised per count and the memory O(octaves)
//! — and computes the estimate from the pyramid:
//!
//! - `μ_j = (1/n_j) Σ_k d_{j,k}²`, the energy of the detail coefficients at
//!   octave `j`;
//! - `y_j = log2 μ_j − g_j` with the bias correction
//!   `g_j = ψ(n_j/2)/ln 2 − log2(n_j/2)` and variance
//!   `σ_j² = ζ(2, n_j/2)/ln² 2` (Gaussian approximation, as in the paper);
//! - a weighted least-squares fit of `y_j` on `j` over octaves `j1..=j2`
//!   (every octave from `j1` with at least [`MIN_COEFFS`] coefficients)
//!   gives the slope `α`, and `H = (1 + α)/2`.
//!
//! For fractional Gaussian noise the Haar details scale exactly as
//! `2^{j(2H−1)}`, so the estimator is unbiased up to the `g_j` correction;
//! `crates/monitor-apps/tests/hurst_fgn.rs` measures the error on exact
//! (Davies–Harte) fGn for H = 0.5 … 0.9.
//!
//! Record schema [`HURST_RECORD`]: `ts, hurst, octaves, bins`.

use crate::abi::{Element, RecordBuilder, View};
use crate::{App, Sink};

/// Finished interval counts waiting for the periodic part.
pub const RING: usize = 4096;
/// Octaves of the pyramid.
pub const OCTAVES: usize = 30;
/// Least number of coefficients for an octave to enter the fit.
pub const MIN_COEFFS: u64 = 4;
/// Schema of an estimate record.
pub const HURST_RECORD: u8 = 5;

const LN2: f64 = core::f64::consts::LN_2;

/// The online Haar pyramid and its per-octave energies.
#[derive(Debug, Clone)]
pub struct Pyramid {
    pending: [f64; OCTAVES + 1],
    has: [bool; OCTAVES + 1],
    sum: [f64; OCTAVES + 1],
    n: [u64; OCTAVES + 1],
    /// Samples pushed.
    pub samples: u64,
}

/// An estimate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// The Hurst parameter.
    pub h: f64,
    /// The fitted slope α.
    pub alpha: f64,
    /// Octaves used.
    pub octaves: u32,
}

impl Default for Pyramid {
    fn default() -> Self {
        Pyramid::new()
    }
}

impl Pyramid {
    /// An empty pyramid.
    pub const fn new() -> Pyramid {
        Pyramid {
            pending: [0.0; OCTAVES + 1],
            has: [false; OCTAVES + 1],
            sum: [0.0; OCTAVES + 1],
            n: [0; OCTAVES + 1],
            samples: 0,
        }
    }

    /// Pushes one sample of the series.
    pub fn push(&mut self, x: f64) {
        self.samples += 1;
        let mut a = x;
        let mut j = 0;
        while j < OCTAVES {
            if !self.has[j] {
                self.pending[j] = a;
                self.has[j] = true;
                return;
            }
            self.has[j] = false;
            let p = self.pending[j];
            let d = (p - a) * core::f64::consts::FRAC_1_SQRT_2;
            a = (p + a) * core::f64::consts::FRAC_1_SQRT_2;
            j += 1;
            self.sum[j] += d * d;
            self.n[j] += 1;
        }
    }

    /// Coefficients at octave `j` (1-based).
    pub fn coefficients(&self, j: usize) -> u64 {
        self.n.get(j).copied().unwrap_or(0)
    }

    /// The estimate over octaves `j1..` (those with at least [`MIN_COEFFS`]
    /// coefficients); `None` with fewer than two octaves or a degenerate fit.
    pub fn estimate(&self, j1: usize) -> Option<Estimate> {
        let (mut s, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
        let mut octaves = 0u32;
        for j in j1.max(1)..=OCTAVES {
            let n = self.n[j];
            if n < MIN_COEFFS || self.sum[j] <= 0.0 {
                break;
            }
            let half = n as f64 / 2.0;
            let y = libm::log2(self.sum[j] / n as f64) - (digamma(half) / LN2 - libm::log2(half));
            let w = 1.0 / (hurwitz_zeta2(half) / (LN2 * LN2));
            let x = j as f64;
            s += w;
            sx += w * x;
            sy += w * y;
            sxx += w * x * x;
            sxy += w * x * y;
            octaves += 1;
        }
        let den = s * sxx - sx * sx;
        if octaves < 2 || den <= 0.0 {
            return None;
        }
        let alpha = (s * sxy - sx * sy) / den;
        Some(Estimate { h: (1.0 + alpha) / 2.0, alpha, octaves })
    }
}

/// The digamma function ψ(x) for x > 0 (recurrence, then the asymptotic series).
pub fn digamma(mut x: f64) -> f64 {
    let mut acc = 0.0;
    while x < 10.0 {
        acc -= 1.0 / x;
        x += 1.0;
    }
    let x2 = 1.0 / (x * x);
    acc + libm::log(x) - 0.5 / x - x2 * (1.0 / 12.0 - x2 * (1.0 / 120.0 - x2 / 252.0))
}

/// The Hurwitz zeta function ζ(2, x) = Σ_k 1/(x+k)² for x > 0.
pub fn hurwitz_zeta2(mut x: f64) -> f64 {
    let mut acc = 0.0;
    while x < 10.0 {
        acc += 1.0 / (x * x);
        x += 1.0;
    }
    let i = 1.0 / x;
    let i2 = i * i;
    acc + i + i2 / 2.0 + i2 * i / 6.0 - i2 * i2 * i / 30.0 + i2 * i2 * i2 * i / 42.0
}

/// Counters of the Hurst application.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HurstCounters {
    /// Intervals counted (including empty ones).
    pub bins: u64,
    /// Interval counts lost because the ring was full (the periodic part ran too rarely).
    pub dropped: u64,
    /// Packets whose timestamp was before the current interval (counted in it).
    pub late: u64,
}

/// The Hurst application.
#[derive(Debug, Clone)]
pub struct Hurst {
    bin_ns: u64,
    j1: usize,
    cur: u64,
    count: u32,
    started: bool,
    ring: [u32; RING],
    head: usize,
    len: usize,
    /// The pyramid (periodic part).
    pub pyramid: Pyramid,
    /// Counters.
    pub counters: HurstCounters,
}

impl Hurst {
    /// Counts per interval of `bin_ns` (at least 1), fits octaves from `j1`.
    pub const fn new(bin_ns: u64, j1: usize) -> Hurst {
        Hurst {
            bin_ns: if bin_ns == 0 { 1 } else { bin_ns },
            j1,
            cur: 0,
            count: 0,
            started: false,
            ring: [0; RING],
            head: 0,
            len: 0,
            pyramid: Pyramid::new(),
            counters: HurstCounters { bins: 0, dropped: 0, late: 0 },
        }
    }

    fn queue(&mut self, c: u32) {
        self.counters.bins += 1;
        if self.len == RING {
            self.counters.dropped += 1;
            return;
        }
        self.ring[(self.head + self.len) % RING] = c;
        self.len += 1;
    }

    /// Feeds the queued counts to the pyramid (the periodic part's work).
    pub fn drain(&mut self) {
        while self.len > 0 {
            let c = self.ring[self.head];
            self.head = (self.head + 1) % RING;
            self.len -= 1;
            self.pyramid.push(f64::from(c));
        }
    }
}

impl App for Hurst {
    fn packet(&mut self, v: &View<'_>, _sink: &mut dyn Sink) {
        let b = v.ts() / self.bin_ns;
        if !self.started {
            self.started = true;
            self.cur = b;
        }
        if b > self.cur {
            self.queue(self.count);
            // Empty intervals are zeros of the series; a gap longer than the
            // ring is cut to the ring (the rest counted as dropped).
            let gap = b - self.cur - 1;
            let room = (RING - self.len) as u64;
            for _ in 0..gap.min(room) {
                self.queue(0);
            }
            if gap > room {
                self.counters.bins += gap - room;
                self.counters.dropped += gap - room;
            }
            self.cur = b;
            self.count = 0;
        } else if b < self.cur {
            self.counters.late += 1;
        }
        self.count = self.count.saturating_add(1);
    }

    fn tick(&mut self, now_ns: u64, sink: &mut dyn Sink) {
        self.drain();
        if let Some(e) = self.pyramid.estimate(self.j1) {
            let mut r = RecordBuilder::new(HURST_RECORD);
            r.uint(Element::Ts, now_ns)
                .float(Element::Hurst, e.h)
                .uint(Element::Octaves, u64::from(e.octaves))
                .uint(Element::Bins, self.pyramid.samples);
            sink.record(r.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_functions_match_known_values() {
        // ψ(1) = −γ, ψ(0.5) = −γ − 2 ln 2; ζ(2,1) = π²/6.
        let gamma = 0.577_215_664_901_532_9;
        assert!((digamma(1.0) + gamma).abs() < 1e-10);
        assert!((digamma(0.5) + gamma + 2.0 * LN2).abs() < 1e-10);
        assert!((hurwitz_zeta2(1.0) - core::f64::consts::PI * core::f64::consts::PI / 6.0).abs() < 1e-10);
    }

    #[test]
    fn haar_pyramid_counts_coefficients_per_octave() {
        let mut p = Pyramid::new();
        for i in 0..1024 {
            p.push(f64::from(i % 7));
        }
        assert_eq!(p.coefficients(1), 512);
        assert_eq!(p.coefficients(2), 256);
        assert_eq!(p.coefficients(10), 1);
    }
}
