//! Prometheus relabelling on series labels (placeholder; being written).
