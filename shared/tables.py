"""A Table storage client for the account the app already uses (the console's indexes live there).

Azure Table storage serves the indexes (`shared/job_index.py`, `shared/poison/entry_index.py`):
newest-first keys, continuation tokens and server-side filters, which blob listings do not give.
Azurite serves tables on its table port (the connection string's `TableEndpoint`).
"""

from __future__ import annotations

from azure.data.tables import TableServiceClient

from shared.settings import StorageConnection


class NoTableEndpoint(Exception):
    """The connection names no table endpoint (a connection string with blob and queue only)."""


def table_service(conn: StorageConnection) -> TableServiceClient:
    """The Table service of the configured account; NoTableEndpoint when it cannot be named.

    Identity based: `AzureWebJobsStorage__tableServiceUri` (the deployment sets it), else derived
    from the account name or from the blob service uri."""
    from shared.storage import DEV_CONNECTION, credential_for

    if conn.connection_string is not None:
        text = conn.connection_string
        if text == "UseDevelopmentStorage=true":
            text = f"{DEV_CONNECTION}TableEndpoint=http://127.0.0.1:10002/devstoreaccount1;"
        parts = dict(p.split("=", 1) for p in text.split(";") if "=" in p)
        if "TableEndpoint" not in parts and "AccountName" not in parts:
            raise NoTableEndpoint("the storage connection string names no TableEndpoint or AccountName")
        if "TableEndpoint" not in parts and "BlobEndpoint" in parts:
            raise NoTableEndpoint("the storage connection string names a BlobEndpoint but no TableEndpoint")
        return TableServiceClient.from_connection_string(text)
    url = conn.table_endpoint()
    if url is None:
        raise NoTableEndpoint(
            "identity-based storage names no table service: set AzureWebJobsStorage__tableServiceUri "
            "or AzureWebJobsStorage__accountName"
        )
    return TableServiceClient(url, credential=credential_for(conn))
