//! The reclaim benchmark: baselines and teravm side by side, statistics, CSV and SVG output.
