//! libmoneta
