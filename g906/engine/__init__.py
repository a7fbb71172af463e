"""The embedded engine. Imports torch: only import it when the engine is used."""
