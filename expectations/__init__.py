"""Great Expectations suites, one per checked table; shipped in the wheel as `fraudrules.expectations`."""
