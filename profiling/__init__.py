"""Measuring a model's costs on the machine it runs on (`moa-pd profile`)."""
