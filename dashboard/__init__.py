"""The fleet dashboard: a Streamlit app over the history (``foreshock dashboard``)."""
