"""The dashboard's files (HTML, JavaScript modules, CSS), served as they are under ``/ui/`` by
``runplane.api.ui``: no build step, nothing fetched from another host."""
