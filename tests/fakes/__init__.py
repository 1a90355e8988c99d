"""Faithful fakes of services that cannot run on the test machines, each speaking the real wire protocol."""
