pub mod attack;
