"""Recipes: TOML -> Recipe (load.load_recipe, with located errors) -> Plan (resolve.resolve).

Submodules are imported where needed, so that `from g906.recipe.plan import Plan` stays light."""
