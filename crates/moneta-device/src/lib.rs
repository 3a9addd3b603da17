//! moneta-device
