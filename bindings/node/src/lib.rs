//! Node.js binding for zerofan (being written).
