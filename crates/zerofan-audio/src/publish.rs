//! Publishing (filled in next).
