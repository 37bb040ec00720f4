"""The dashboard's pages: each a script Streamlit runs, calling ``main()``."""
