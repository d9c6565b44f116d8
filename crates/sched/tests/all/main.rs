//! Integration tests of anode-sched, in one binary: sessions and admission,
//! the Marshal example, property tests, the simulated Fig. 11 run, and the
//! fuzz seed replay.
#![allow(clippy::unwrap_used)]

mod common;
mod fig11;
mod fuzz_seeds;
mod marshal;
mod props;
mod sessions;
