"""The documentation's generated parts (``pgqueue bench report``): the results page's
tables, section by section, the README's effects figures and the command-line reference."""
