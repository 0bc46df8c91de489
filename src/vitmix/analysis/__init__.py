"""Analysis helpers: approximation error, Newton–Schulz convergence, distance distributions, head
diversity. Import the submodules directly (e.g. ``vitmix.analysis.fibottention``); this package
imports nothing so that each helper stays light."""
