"""PNG charts of the results files (``pgqueue bench plot``), and each driver's own charts."""
