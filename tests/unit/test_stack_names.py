"""A stack's tables are named once (``runplane.adapters.names``): each has its setting, and each
cloud names every one, derived from the prefix or as the settings give it."""

import pytest

from runplane.adapters.aws.provision import AwsNames
from runplane.adapters.azure.provision import AzureNames
from runplane.adapters.names import TABLES
from runplane.domain.errors import InvalidRequest
from runplane.settings import StackSettings


def test_every_table_has_its_setting_and_every_table_setting_a_table():
    settings = {name for name in StackSettings.model_fields if name.endswith("_table")}
    assert settings - {"relay_table"} == set(TABLES)  # the AWS relay's connections: AWS's alone (below)
    assert set(TABLES.values()) == {"runs", "workers", "tokens", "pools", "quotas", "secrets", "sessions"}


def test_each_cloud_derives_the_tables_the_settings_leave_empty_and_keeps_the_others():
    settings = StackSettings(prefix="lab", quotas_table="shared-quotas", bucket="lab-bucket")
    aws = AwsNames.of(settings)
    assert aws.tables == (
        "lab-runs",
        "lab-workers",
        "lab-tokens",
        "lab-pools",
        "shared-quotas",
        "lab-secrets",
        "lab-sessions",
    )
    assert aws.bucket == "lab-bucket"
    assert AwsNames(prefix="lab").bucket == "lab-data"
    assert aws.relay_table == "lab-relay"
    assert AwsNames.of(StackSettings(prefix="lab", relay_table="x")).relay_table == "x"
    assert aws.secrets_key == "alias/lab-secrets"
    assert AwsNames.of(settings.model_copy(update={"secrets_key": "arn:aws:kms:eu-west-1:1:key/k"})).secrets_key == (
        "arn:aws:kms:eu-west-1:1:key/k"
    )

    azure = AzureNames.of(settings.model_copy(update={"cloud": "azure", "quotas_table": "sharedquotas"}))
    assert azure.tables == (
        "labruns",
        "labworkers",
        "labtokens",
        "labpools",
        "sharedquotas",
        "labsecrets",
        "labsessions",
    )
    assert azure.container == "lab-bucket"
    with pytest.raises(InvalidRequest, match="shared-quotas"):
        AzureNames.of(settings)  # Table storage refuses a hyphen
