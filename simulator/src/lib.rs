#![doc = include_str!("../README.md")]

mod engine;
mod regions;
mod report;
mod scenario;
mod service;
mod store;

pub use engine::{FaultSwitch, SimulationError};
pub use regions::{
    Counting, GlobalRow, Region, RegionFault, RegionRow, RegionalCustomer, Regions, RegionsGroup,
    RegionsReport, ShareBy,
};
pub use report::{Counts, GroupReport, Phase, Report, Row, Traced, WorstWindow};
pub use scenario::{AlgorithmKind, Customer, PolicyName, Scenario, ScenarioError};
pub use service::{RateLimited, SimBody};
pub use store::{FaultKind, InstanceContext, SharedStore, SimClock};
