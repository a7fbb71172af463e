from g906.cli.app import main

main()
