"""Cloud-agnostic domain: models, states, errors, units."""
