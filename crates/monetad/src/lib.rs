//! monetad
