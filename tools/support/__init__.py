"""Development helpers shared by the tools (bench, demos, local broker) and the tests: not part of the package."""
