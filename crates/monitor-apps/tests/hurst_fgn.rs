//! The Hurst estimator on exact fractional Gaussian noise.
//!
//! fGn of known H is generated with the Davies–Harte method (circulant
//! embedding of the exact autocovariance, which is exact for fGn because the
//! embedding's eigenvalues are non-negative), then pushed through the same
//! pyramid and fit the module runs. `ANODE_HURST_CSV=path` also writes the
//! per-H results as CSV (see docs/monitor.md).
#![allow(clippy::unwrap_used)]

use anode_monitor_apps::hurst::Pyramid;
use rand::SeedableRng;
use rand_distr::{Distribution, StandardNormal};
use rustfft::FftPlanner;
use rustfft::num_complex::Complex;

fn autocov(h: f64, k: f64) -> f64 {
    0.5 * ((k + 1.0).abs().powf(2.0 * h) - 2.0 * k.abs().powf(2.0 * h) + (k - 1.0).abs().powf(2.0 * h))
}

/// `n` (a power of two) samples of unit-variance fGn with Hurst parameter `h`.
fn davies_harte(n: usize, h: f64, rng: &mut rand::rngs::StdRng) -> Vec<f64> {
    let m = 2 * n;
    let mut c: Vec<Complex<f64>> = (0..m)
        .map(|j| {
            let k = if j <= n { j } else { m - j };
            Complex::new(autocov(h, k as f64), 0.0)
        })
        .collect();
    let mut planner = FftPlanner::new();
    let fft = planner.plan_fft_forward(m);
    fft.process(&mut c);
    let lambda: Vec<f64> = c.iter().map(|z| z.re.max(0.0)).collect();
    assert!(c.iter().all(|z| z.re > -1e-8), "circulant embedding not non-negative");
    let mut z = || -> f64 { StandardNormal.sample(rng) };
    let mf = m as f64;
    let mut v = vec![Complex::new(0.0, 0.0); m];
    v[0] = Complex::new((lambda[0] / mf).sqrt() * z(), 0.0);
    v[n] = Complex::new((lambda[n] / mf).sqrt() * z(), 0.0);
    for k in 1..n {
        let s = (lambda[k] / (2.0 * mf)).sqrt();
        let w = Complex::new(s * z(), s * z());
        v[k] = w;
        v[m - k] = w.conj();
    }
    fft.process(&mut v);
    v[..n].iter().map(|x| x.re).collect()
}

#[test]
fn hurst_estimates_on_exact_fgn_for_h_from_0_5_to_0_9() {
    let n = 1 << 16;
    let runs = 8;
    let j1 = 1;
    let mut rng = rand::rngs::StdRng::seed_from_u64(2000);
    let mut csv = String::from("h_true,runs,n,j1,h_mean,h_sd,bias,rmse\n");
    println!(
        "H true | mean estimate | sd     | bias    | RMSE   ({runs} series of {n} samples, octaves from j1 = {j1})"
    );
    for h in [0.5, 0.6, 0.7, 0.8, 0.9] {
        let est: Vec<f64> = (0..runs)
            .map(|_| {
                let x = davies_harte(n, h, &mut rng);
                let mut p = Pyramid::new();
                for s in x {
                    p.push(100.0 + 10.0 * s);
                }
                p.estimate(j1).unwrap().h
            })
            .collect();
        let mean = est.iter().sum::<f64>() / runs as f64;
        let sd = (est.iter().map(|e| (e - mean).powi(2)).sum::<f64>() / (runs - 1) as f64).sqrt();
        let rmse = (est.iter().map(|e| (e - h).powi(2)).sum::<f64>() / runs as f64).sqrt();
        println!("{h:.1}    | {mean:.4}        | {sd:.4} | {:+.4} | {rmse:.4}", mean - h);
        csv.push_str(&format!("{h},{runs},{n},{j1},{mean:.5},{sd:.5},{:.5},{rmse:.5}\n", mean - h));
        assert!((mean - h).abs() < 0.03, "H = {h}: mean estimate {mean}");
        assert!(rmse < 0.05, "H = {h}: RMSE {rmse}");
    }
    if let Some(p) = std::env::var_os("ANODE_HURST_CSV") {
        std::fs::write(p, csv).unwrap();
    }
}
