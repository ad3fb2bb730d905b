"""Choosing each question's proposers from a pool before any runs (RouteMoA), and correcting
their weights from the answers that exist."""
