"""The contract suites run against every implementation of a port. Each implementation is a
fixture param; an Azure (Azurite) implementation joins the list beside the moto one."""

import pytest

IMPLEMENTATIONS = ["aws-moto"]


@pytest.fixture(params=IMPLEMENTATIONS)
def stack(request, aws_stack):
    if request.param == "aws-moto":
        return aws_stack
    raise AssertionError(request.param)
