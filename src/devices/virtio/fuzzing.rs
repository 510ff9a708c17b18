//! Drivers for the fuzz targets (placeholder).
