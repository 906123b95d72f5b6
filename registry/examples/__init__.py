"""Example code shipped with the package (the quickstart trains registry.examples.tinytrainer)."""
