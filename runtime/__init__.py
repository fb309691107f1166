"""The qdc runtime: loads artifacts and launches them. It never imports the compiler."""
