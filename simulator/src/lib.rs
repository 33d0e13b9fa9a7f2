#![doc = include_str!("../README.md")]

mod engine;
mod report;
mod scenario;
mod store;

pub use engine::{FaultSwitch, SimulationError};
pub use report::{Counts, GroupReport, Phase, Report, Row, Traced};
pub use scenario::{AlgorithmKind, Customer, PolicyName, Scenario, ScenarioError};
pub use store::{FaultKind, InstanceContext, SharedStore, SimClock};
